"""The stage code of tests/support/split_kind.py's kind: imported by workers alone, on first use."""

from __future__ import annotations

from typing import Any

from shared.tasks import StageContext, TaskKind
from tests.support.split_kind import EchoSpec


class EchoKind(EchoSpec, TaskKind):
    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        return {"answer": ctx.task["text"]}

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        return {"reward": 1.0 if ctx.outputs["rollout"]["answer"] == ctx.task["text"] else 0.0}
