"""A real `rollouts api` process over a redis-server of its own, for tests that talk HTTP to it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from cli.embedded_redis import EmbeddedRedis, free_port
from tests.support.waiting import wait_for


@contextmanager
def running_api(state: Path, **env: str) -> Iterator[str]:
    """Yields the API's URL; `env` adds settings (ROLLOUTS_API_TOKENS=...). Its log is state/api.log."""
    redis = EmbeddedRedis(data_dir=state / "redis").start()
    port = free_port()
    full_env = {**os.environ, "ROLLOUTS_REDIS_URL": redis.url, "ROLLOUTS_STATE_DIR": str(state), **env}
    with open(state / "api.log", "ab") as log:
        api = subprocess.Popen(
            [sys.executable, "-m", "cli", "api", "--port", str(port)],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, timeout=60, what="the API to start")
        yield url
    finally:
        api.terminate()
        api.wait(timeout=10)
        redis.stop()
