"""`rollouts api` beyond loopback with no tokens refuses to start, unless the operator opts out."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from cli.connect import is_loopback
from cli.embedded_redis import free_port
from tests.support.waiting import wait_for


def serve(host: str, **env: str) -> subprocess.Popen[str]:
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTS_")}
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "api", "--host", host, "--port", str(port)],
        env={**clean, "ROLLOUTS_REDIS_URL": "redis://127.0.0.1:9/0", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_beyond_loopback_with_no_tokens_it_refuses_naming_the_settings() -> None:
    process = serve("0.0.0.0")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert "ROLLOUTS_API_TOKENS" in err and "ROLLOUTS_ALLOW_OPEN_API" in err


@pytest.mark.parametrize(
    "env", [{"ROLLOUTS_API_TOKENS": "t", "ROLLOUTS_ADMIN_TOKENS": "a"}, {"ROLLOUTS_ALLOW_OPEN_API": "1"}]
)
def test_with_tokens_or_the_explicit_opt_out_it_serves(env: dict[str, str]) -> None:
    process = serve("0.0.0.0", **env)
    url = f"http://127.0.0.1:{process.args[-1]}/healthz"
    try:
        wait_for(lambda: _answers(url) or process.poll() is not None, timeout=60, what="the API to answer")
        assert process.poll() is None, process.communicate()[1]
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return False
    return True


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("127.0.0.2", True),
        ("0.0.0.0", False),
        ("192.0.2.2", False),
        ("node17", False),
    ],
)
def test_which_binds_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
