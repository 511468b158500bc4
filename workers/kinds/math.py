"""The `math` kind's stages (its spec: shared/kinds/math.py): the prompt, and the grading.

The reward is 1.0 when the answer, read as the field writes answers (\\boxed{},
"#### N", "The answer is N", a sentence's last number: workers/eval/answers.py),
is mathematically equivalent to the reference (workers/eval/math_equiv.py).
"""

from __future__ import annotations

from typing import Any

from shared.kinds.formats import math_problem, math_reference
from shared.kinds.math import MathSpec
from shared.tasks.context import StageContext
from workers.eval.answer_grading import grade_math
from workers.eval.answers import trajectory_texts
from workers.kinds.agentic import AgentTask

SYSTEM_PROMPT = (
    "Solve the math problem. You can run Python (sympy is available) to check your work. "
    'Put your final answer in \\boxed{} and call finish with it, e.g. finish(answer="\\boxed{42}").'
)


def reference_answer(task: dict[str, Any]) -> str:
    """The reference as text (a JSON number is accepted: 0.5 -> "0.5"), extracted as the row's format says."""
    return math_reference(task)


class MathKind(MathSpec, AgentTask):
    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        system = task.get("system_prompt") or SYSTEM_PROMPT
        return [{"role": "system", "content": system}, {"role": "user", "content": math_problem(task)}]

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        final_text, answer = trajectory_texts(ctx.outputs.get("rollout") or {})
        return grade_math(final_text, answer, reference_answer(ctx.task))
