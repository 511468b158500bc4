"""The `math` kind's spec: a competition-style problem, answered in \\boxed{}, rewarded by equivalence.

Task fields: `problem` (the statement), `answer` (the reference, LaTeX or
plain), optional `system_prompt`. Published rows are read as they are with
`format` (shared/kinds/formats.py): GSM8K (`question`, `answer` ending in
"#### N"), MATH (`problem`, `solution` with \\boxed{}), plain `answer` rows.
The agent has the python tool (sympy is importable there) and finish. Its
stages (the prompt, the grading): workers/kinds/math.py.
"""

from __future__ import annotations

from typing import Any, ClassVar

from shared.kinds.agentic import AgentSpec
from shared.kinds.formats import math_problem, math_reference, math_reference_output, task_format
from shared.tasks.registry import register


@register
class MathSpec(AgentSpec):
    name = "math"
    stages = "workers.kinds.math:MathKind"
    tools: ClassVar[tuple[str, ...]] = ("python", "finish")

    def validate(self, task: dict[str, Any]) -> None:
        super().validate(task)
        task_format(task, self.name)
        math_problem(task)
        math_reference(task)

    def given_rollout(self, task: dict[str, Any], output: str | None) -> dict[str, Any]:
        """An answer given instead of sampled (the finish argument); None: the row's own reference."""
        if output is None:
            return math_reference_output(task)
        return {"final_text": "", "answer": output}
