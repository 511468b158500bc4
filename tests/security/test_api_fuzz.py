"""Fuzz the live API from its own OpenAPI document: no input makes it answer 5xx or hang.

Schemathesis generates requests for every operation (valid ones, and with
negative data, ones that break the schema). The run is bounded and
reproducible: a fixed number of examples per operation, Hypothesis'
derandomized mode (a fixed seed) and a per-request timeout that turns a hang
into a failure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from api.app import create_app
from shared.config import Settings
from tests.support.live_api import running_api

ADMIN_TOKEN = "fuzz-admin-token"
EXAMPLES_PER_OPERATION = 25
REQUEST_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def live_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real uvicorn API process over its own redis-server, with auth on."""
    state = tmp_path_factory.mktemp("fuzz")
    settings = {
        "ROLLOUTS_API_TOKENS": "fuzz-reader-token",
        "ROLLOUTS_ADMIN_TOKENS": ADMIN_TOKEN,
        "ROLLOUTS_MAX_JOBS_PER_REQUEST": "50",
    }
    try:
        with running_api(state, **settings) as url:
            yield url
    finally:
        _print_server_errors(state / "api.log")


def _print_server_errors(path: Path) -> None:
    text = path.read_text(errors="replace") if path.exists() else ""
    if "Traceback" in text:
        print(text[-4000:])


@pytest.fixture(scope="module")
def tally() -> Iterator[Counter[int]]:
    """Status codes of every fuzzed request, printed as the test's figure (run with -s)."""
    codes: Counter[int] = Counter()
    yield codes
    print(f"\nfuzz: {sum(codes.values())} requests, status codes {dict(sorted(codes.items()))}")


def _spec() -> dict:
    # The same document the live server serves at /openapi.json; building it needs no Redis.
    return create_app(Settings(redis_url="redis://unused:1/0")).openapi()


schema = schemathesis.openapi.from_dict(_spec())


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_request_gets_a_5xx_or_hangs(case, live_api, tally):
    response = case.call_and_validate(
        base_url=live_api,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        checks=[not_a_server_error],
        timeout=REQUEST_TIMEOUT_S,
    )
    tally[response.status_code] += 1
