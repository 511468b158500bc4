"""The `stem` kind's spec: science questions, multiple choice or short answer (values with units).

Task fields: `question`; `choices` (optional: a list, lettered A, B, ... in
order, or a map letter -> text) with `answer` the right letter; or, without
choices, `answer` the reference value ("9.8 m/s^2", "42", "\\frac{1}{2}",
a word), with optional `unit` (appended to a bare reference) and `rel_tol`
(relative tolerance for numbers, default 0.01). The agent has python and finish.
Its stages (the prompt, the grading): workers/kinds/stem.py.
"""

from __future__ import annotations

import string
from typing import Any, ClassVar

from shared.kinds.agentic import AgentSpec
from shared.kinds.task_fields import optional_number, require_str
from shared.tasks.base import TaskValidationError
from shared.tasks.registry import register


def choices_of(task: dict[str, Any]) -> dict[str, str]:
    """The choices as letter -> text ({} for a short-answer question)."""
    raw = task.get("choices")
    if raw is None:
        return {}
    if isinstance(raw, list):
        return dict(zip(string.ascii_uppercase, (str(c) for c in raw), strict=False))
    return {str(k).strip().upper(): str(v) for k, v in raw.items()}


def reference_value(task: dict[str, Any]) -> str:
    value = task["answer"] if isinstance(task["answer"], str) else repr(task["answer"])
    unit = task.get("unit")
    return f"{value} {unit}" if unit else value


@register
class StemSpec(AgentSpec):
    name = "stem"
    stages = "workers.kinds.stem:StemKind"
    tools: ClassVar[tuple[str, ...]] = ("python", "finish")

    def validate(self, task: dict[str, Any]) -> None:
        super().validate(task)
        require_str(task, "question")
        raw = task.get("choices")
        if raw is not None:
            if isinstance(raw, list):
                ok = 2 <= len(raw) <= 26
            else:
                ok = (
                    isinstance(raw, dict)
                    and len(raw) >= 2
                    and all(isinstance(k, str) and len(k.strip()) == 1 and k.strip().isalpha() for k in raw)
                )
            if not ok:
                raise TaskValidationError("task.choices: 2 to 26 options, a list or a map letter -> text")
            letter = task.get("answer")
            if not isinstance(letter, str) or letter.strip().upper() not in choices_of(task):
                raise TaskValidationError("task.answer: the letter of the right choice")
        else:
            value = task.get("answer")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
                raise TaskValidationError("task.answer: required, the reference value (a string or a number)")
        if "unit" in task and not isinstance(task["unit"], str):
            raise TaskValidationError('task.unit: a string such as "m/s^2"')
        optional_number(task, "rel_tol", 0, 1)

    def given_rollout(self, task: dict[str, Any], output: str | None) -> dict[str, Any]:
        """An answer given instead of sampled (the finish argument); None: the reference letter or value."""
        if output is None:
            output = task["answer"].strip().upper() if choices_of(task) else reference_value(task)
        return {"final_text": "", "answer": output}
