"""No-op work for bench.pipeline: a task kind whose stages do nothing, and a bare rq chain.

Both sides do the same (no) work, so the difference is pure orchestration overhead.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from rq import Queue, get_current_job

from shared.tasks import StageContext, TaskKind, register

BARE_DONE_KEY = "bench:bare:done"


@register
class NoopKind(TaskKind):
    name = "noop"

    def init(self, ctx: StageContext) -> dict[str, Any]:
        return {}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        return {}

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        return {"reward": 0.0}


def _connection() -> Redis:
    job = get_current_job()
    assert job is not None
    return job.connection


def bare_init(index: int) -> None:
    Queue("bare-rollout", connection=_connection()).enqueue(bare_rollout, index, result_ttl=0)


def bare_rollout(index: int) -> None:
    Queue("bare-eval", connection=_connection()).enqueue(bare_eval, index, result_ttl=0)


def bare_eval(index: int) -> None:
    _connection().incr(BARE_DONE_KEY)
