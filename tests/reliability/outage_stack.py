"""What the Redis fault tests share (an outage, a full disk under Redis): a stack whose embedded Redis keeps
an append-only file, one process per stage, and the two loops they run around the fault."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from cli.stack import Stack
from shared.config import Settings
from tests.pipeline.conftest import FAST_RECOVERY_ENV
from tests.support.waiting import wait_for

SLOTS = {"init": 2, "rollout": 4, "eval": 2}
# Each stage slower than the one before it, so every stage has a queue when Redis goes away and
# when it comes back: a slot that does not take a job then is a slot that did not resume.
SLEEP = {"init": 0.5, "rollout": 2.0, "eval": 1.5}


@contextmanager
def running_persistent_stack(tmp_path: Path, slots: dict[str, int]) -> Iterator[Stack]:
    """A stack whose embedded Redis keeps an append-only file (as `rollouts up`), one process per stage with
    `slots`, its state under tmp_path/state (a test mounts what it needs there first)."""
    settings = Settings(redis_url=None, state_dir=tmp_path / "state")
    stack = Stack(
        settings,
        api_port=0,
        concurrency=slots,
        log_dir=tmp_path / "logs",
        persistent_redis=True,
        extra_env=FAST_RECOVERY_ENV,
    )
    with stack:
        stack.wait_for_workers()
        yield stack


@pytest.fixture()
def persistent_stack(tmp_path: Path) -> Iterator[Stack]:
    """running_persistent_stack with SLOTS."""
    with running_persistent_stack(tmp_path, SLOTS) as stack:
        yield stack


def every_second_for(seconds: float, action: Callable[[], None]) -> None:
    """Call `action` once a second (at least once) until `seconds` have passed."""
    end = time.monotonic() + seconds
    while True:
        action()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(1.0, left))


def submit_until_accepted(api: httpx.Client, jobs: list[dict]) -> list[str]:
    """Submit `jobs` again and again until the API takes them (it answers 503 while Redis cannot keep them)."""

    def accepted() -> list[str] | None:
        try:
            response = api.post("/v1/jobs", json=jobs)
        except httpx.HTTPError:
            return None
        return response.json()["job_ids"] if response.status_code == 202 else None

    return wait_for(accepted, timeout=60, interval=0.2, what="the API to accept jobs again")
