"""The `math` kind: a competition-style problem, answered in \\boxed{}, rewarded by equivalence.

Task fields: `problem` (the statement), `answer` (the reference, LaTeX or
plain), optional `system_prompt`. Published rows are read as they are with
`format` (workers/kinds/formats.py): GSM8K (`question`, `answer` ending in
"#### N"), MATH (`problem`, `solution` with \\boxed{}), plain `answer` rows.
The agent has the python tool (sympy is importable there) and finish. The
reward is 1.0 when the answer, read as the field writes answers (\\boxed{},
"#### N", "The answer is N", a sentence's last number: workers/eval/answers.py),
is mathematically equivalent to the reference (workers/eval/math_equiv.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

from shared.tasks.context import StageContext
from shared.tasks.registry import register
from workers.eval.answer_grading import grade_math
from workers.eval.answers import trajectory_texts
from workers.kinds.agentic import AgentTask
from workers.kinds.formats import (
    math_problem,
    math_reference,
    math_reference_output,
    task_format,
)

SYSTEM_PROMPT = (
    "Solve the math problem. You can run Python (sympy is available) to check your work. "
    'Put your final answer in \\boxed{} and call finish with it, e.g. finish(answer="\\boxed{42}").'
)


def reference_answer(task: dict[str, Any]) -> str:
    """The reference as text (a JSON number is accepted: 0.5 -> "0.5"), extracted as the row's format says."""
    return math_reference(task)


@register
class MathKind(AgentTask):
    name = "math"
    tools: ClassVar[tuple[str, ...]] = ("python", "finish")

    def validate(self, task: dict[str, Any]) -> None:
        super().validate(task)
        task_format(task, self.name)
        math_problem(task)
        math_reference(task)

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        system = task.get("system_prompt") or SYSTEM_PROMPT
        return [{"role": "system", "content": system}, {"role": "user", "content": math_problem(task)}]

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        final_text, answer = trajectory_texts(ctx.outputs.get("rollout") or {})
        return grade_math(final_text, answer, reference_answer(ctx.task))

    def given_rollout(self, task: dict[str, Any], output: str | None) -> dict[str, Any]:
        """An answer given instead of sampled (the finish argument); None: the row's own reference."""
        if output is None:
            return math_reference_output(task)
        return {"final_text": "", "answer": output}
