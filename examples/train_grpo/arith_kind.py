"""The `arith` kind: multiply two numbers with the python tool, then finish with the product.

Small enough for a tiny byte-level model to learn on a CPU: the agent must copy the
operands into a `print(a*b)` call (turn 1), read the tool's output and copy it into
`finish` (turn 2). Exact-match reward. Load it with
ROLLOUTS_TASK_MODULES=examples.train_grpo.arith_kind (the trainer's stack does).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any, ClassVar

from shared.config import Settings
from shared.tasks.base import TaskValidationError
from shared.tasks.context import StageContext
from shared.tasks.registry import register
from workers.kinds.agentic import AgentTask, agent_env
from workers.sandbox.spec import SandboxSpec

SYSTEM_PROMPT = "Use python, then finish."
MAX_OPERAND = 10**6


def problem(task: dict[str, Any]) -> str:
    return f"{task['a']}*{task['b']}"


def product(task: dict[str, Any]) -> str:
    return str(task["a"] * task["b"])


def sample_task(rng: random.Random, digits: int) -> dict[str, Any]:
    """Two operands of exactly `digits` digits (no zero): a fixed width keeps the copy offsets constant,
    which is what a 1M-parameter model can pick up in a few hundred warm-up steps."""

    def operand() -> int:
        return rng.randint(10 ** (digits - 1) if digits > 1 else 1, 10**digits - 1)

    return {"kind": "arith", "a": operand(), "b": operand(), "max_turns": 3}


def task_source(rng: random.Random, digits: int, pool: int) -> Callable[[], dict[str, Any]]:
    """Draws tasks: fresh ones each time, or (pool > 0) from a fixed set of `pool` tasks made once."""
    if pool <= 0:
        return lambda: sample_task(rng, digits)
    fixed = [sample_task(random.Random(i), digits) for i in range(pool)]
    return lambda: dict(rng.choice(fixed))


def tool_call(name: str, arguments: dict[str, str]) -> str:
    """A Hermes-style call exactly as the warm-up traces write it (the parser accepts any valid JSON)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def reference_turns(task: dict[str, Any]) -> tuple[str, str]:
    """The two assistant messages of a correct episode: the python call, then finish."""
    return (tool_call("python", {"code": f"print({problem(task)})"}), tool_call("finish", {"answer": product(task)}))


@register
class ArithKind(AgentTask):
    name = "arith"
    tools: ClassVar[tuple[str, ...]] = ("python", "finish")

    def validate(self, task: dict[str, Any]) -> None:
        super().validate(task)
        for field in ("a", "b"):
            value = task.get(field)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_OPERAND:
                raise TaskValidationError(f"task.{field}: an integer in [0, {MAX_OPERAND})")

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem(task)}]

    def sandbox_spec(self, task: dict[str, Any], settings: Settings) -> SandboxSpec:
        return SandboxSpec(env=agent_env(settings))

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        answer = (ctx.outputs.get("rollout") or {}).get("answer")
        extracted = answer.strip() if isinstance(answer, str) else None
        reference = product(ctx.task)
        return {"reward": float(extracted == reference), "extracted": extracted, "reference": reference}
