"""The `stem` kind: science questions, multiple choice or short answer (values with units).

Task fields: `question`; `choices` (optional: a list, lettered A, B, ... in
order, or a map letter -> text) with `answer` the right letter; or, without
choices, `answer` the reference value ("9.8 m/s^2", "42", "\\frac{1}{2}",
a word), with optional `unit` (appended to a bare reference) and `rel_tol`
(relative tolerance for numbers, default 0.01). The agent has python and finish.
"""

from __future__ import annotations

import string
from typing import Any, ClassVar

from shared.tasks.base import TaskValidationError
from shared.tasks.context import StageContext
from shared.tasks.registry import register
from workers.eval.answer_grading import DEFAULT_REL_TOL, grade_choice, grade_value
from workers.eval.answers import trajectory_texts
from workers.kinds.agentic import AgentTask
from workers.kinds.task_fields import optional_number, require_str

CHOICE_PROMPT = (
    "Answer the multiple-choice question. You can run Python to compute. "
    'Finish by calling finish with the letter of your choice, e.g. finish(answer="B").'
)
VALUE_PROMPT = (
    "Answer the question. You can run Python to compute. Give the final value with its unit "
    'where it has one, in \\boxed{}, and call finish with it, e.g. finish(answer="\\boxed{9.8 m/s^2}").'
)


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
class StemKind(AgentTask):
    name = "stem"
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

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        choices = choices_of(task)
        question = task["question"].strip()
        if choices:
            question += "\n\n" + "\n".join(f"({letter}) {text}" for letter, text in choices.items())
        system = task.get("system_prompt") or (CHOICE_PROMPT if choices else VALUE_PROMPT)
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        task = ctx.task
        final_text, answer = trajectory_texts(ctx.outputs.get("rollout") or {})
        choices = choices_of(task)
        if choices:
            return grade_choice(final_text, answer, choices, task["answer"].strip().upper())
        rel_tol = float(task.get("rel_tol", DEFAULT_REL_TOL))
        return grade_value(final_text, answer, reference_value(task), rel_tol)

    def given_rollout(self, task: dict[str, Any], output: str | None) -> dict[str, Any]:
        """An answer given instead of sampled (the finish argument); None: the reference letter or value."""
        if output is None:
            output = task["answer"].strip().upper() if choices_of(task) else reference_value(task)
        return {"final_text": "", "answer": output}
