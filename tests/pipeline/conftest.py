"""A real stack per test module or test: embedded redis-server, uvicorn API, one process per stage."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli.stack import Stack
from shared.config import Settings

# Short heartbeats so a killed worker's job is re-queued within seconds, not minutes.
FAST_RECOVERY_ENV = {
    "ROLLOUTS_TASK_MODULES": "tests.support.kinds",
    "ROLLOUTS_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_HEARTBEAT_TTL_S": "6",
    "ROLLOUTS_MAINTENANCE_INTERVAL_S": "2",
}


@pytest.fixture()
def make_stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    stacks: list[Stack] = []

    def make(
        concurrency: dict[str, int] | None = None, env: dict[str, str] | None = None, token: str | None = None
    ) -> Stack:
        settings = Settings(redis_url=None, state_dir=tmp_path / "state")
        stack = Stack(
            settings,
            api_port=0,
            concurrency=concurrency or {"init": 2, "rollout": 4, "eval": 2},
            log_dir=tmp_path / "logs",
            extra_env={**FAST_RECOVERY_ENV, **(env or {})},
        )
        stacks.append(stack)
        stack.start()
        stack.wait_for_workers(token=token)  # the token of a stack started with ROLLOUTS_API_TOKENS
        return stack

    yield make
    for stack in stacks:
        stack.stop(timeout=10)


@pytest.fixture()
def trace_dir(tmp_path: Path) -> Path:
    path = tmp_path / "trace"
    path.mkdir()
    return path
