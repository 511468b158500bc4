"""A real stack (embedded Redis, API, one worker per stage) with the dapo_sim kind, for module fixtures."""

from __future__ import annotations

from pathlib import Path

from cli.stack import Stack
from shared.config import Settings

LIVE_ENV = {
    "ROLLOUTS_TASK_MODULES": "bench.dapo_kind",
    "ROLLOUTS_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_HEARTBEAT_TTL_S": "6",
    "ROLLOUTS_MAINTENANCE_INTERVAL_S": "2",
}


def start_stack(root: Path, rollout_slots: int = 16) -> Stack:
    settings = Settings(redis_url=None, state_dir=root / "state")
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": 4, "rollout": rollout_slots, "eval": 4},
        log_dir=root / "logs",
        extra_env=LIVE_ENV,
    )
    stack.start()
    stack.wait_for_workers()
    return stack
