"""Polling helpers for tests that drive real processes: wait for a condition, with a generous cap."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

TERMINAL = {"done", "failed", "cancelled", "timed_out"}


def wait_for(
    condition: Callable[[], T],
    timeout: float = 60.0,
    interval: float = 0.1,
    what: str | Callable[[], str] = "condition",
) -> T:
    """Return condition()'s first truthy value; fail the test if none comes within `timeout`.
    `what` may be a callable, asked only on failure, to say what was still missing then."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {said}")
        time.sleep(interval)


def responds(url: str) -> bool:
    """Whether `url` answers 200; a refused connection or a slow answer (a busy machine) is a no, never
    an error, so `wait_for(lambda: responds(url))` waits on events rather than on a speed."""
    try:
        return httpx.get(url, timeout=10.0).status_code == 200
    except httpx.HTTPError:
        return False


def client_for(stack: Any) -> httpx.Client:
    """An HTTP client for a running cli.stack.Stack."""
    return httpx.Client(base_url=stack.api_url, timeout=10.0)


def job(api: httpx.Client, job_id: str) -> dict[str, Any]:
    response = api.get(f"/v1/jobs/{job_id}")
    response.raise_for_status()
    return response.json()


def wait_status(
    api: httpx.Client, job_id: str, statuses: set[str] | None = None, timeout: float = 60.0
) -> dict[str, Any]:
    wanted = statuses or TERMINAL

    def reached() -> dict[str, Any] | None:
        record = job(api, job_id)
        return record if record["status"] in wanted else None

    return wait_for(reached, timeout, what=f"job {job_id} to reach {sorted(wanted)}")


def trace(trace_dir: Path, job_id: str) -> list[str]:
    path = trace_dir / f"{job_id}.log"
    return path.read_text().splitlines() if path.exists() else []
