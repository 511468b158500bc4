"""The `math` kind: a competition-style problem, answered in \\boxed{}, rewarded by equivalence.

Task fields: `problem` (the statement), `answer` (the reference, LaTeX or
plain), optional `system_prompt`. The agent has the python tool (sympy is
importable there) and finish. The reward is 1.0 when the last \\boxed{} (in
the finish answer, else in the last message; else the finish answer itself)
is mathematically equivalent to the reference (workers/eval/math_equiv.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

from shared.config import Settings
from shared.sandbox.spec import SandboxSpec
from shared.tasks.agentic import AgentTask
from shared.tasks.base import TaskValidationError
from shared.tasks.context import StageContext
from shared.tasks.kind_support import agent_env, require_str
from shared.tasks.registry import register

SYSTEM_PROMPT = (
    "Solve the math problem. You can run Python (sympy is available) to check your work. "
    'Put your final answer in \\boxed{} and call finish with it, e.g. finish(answer="\\boxed{42}").'
)


def reference_answer(task: dict[str, Any]) -> str:
    """The reference as text (a JSON number is accepted: 0.5 -> "0.5")."""
    value = task.get("answer")
    return value if isinstance(value, str) else repr(value)


@register
class MathKind(AgentTask):
    name = "math"
    tools: ClassVar[tuple[str, ...]] = ("python", "finish")

    def validate(self, task: dict[str, Any]) -> None:
        super().validate(task)
        require_str(task, "problem")
        value = task.get("answer")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
            raise TaskValidationError("task.answer: required, the reference answer (a string or a number)")

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        system = task.get("system_prompt") or SYSTEM_PROMPT
        return [{"role": "system", "content": system}, {"role": "user", "content": task["problem"]}]

    def sandbox_spec(self, task: dict[str, Any], settings: Settings) -> SandboxSpec:
        return SandboxSpec(env=agent_env(settings))

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        from workers.eval.answer_grading import grade_math
        from workers.eval.answers import trajectory_texts

        final_text, answer = trajectory_texts(ctx.outputs.get("rollout") or {})
        return grade_math(final_text, answer, reference_answer(ctx.task))
