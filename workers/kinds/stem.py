"""The `stem` kind's stages (its spec: shared/kinds/stem.py): the prompt, and the grading of a letter or
a value with its unit."""

from __future__ import annotations

from typing import Any

from shared.kinds.stem import StemSpec, choices_of, reference_value
from shared.tasks.context import StageContext
from workers.eval.answer_grading import DEFAULT_REL_TOL, grade_choice, grade_value
from workers.eval.answers import trajectory_texts
from workers.kinds.agentic import AgentTask

CHOICE_PROMPT = (
    "Answer the multiple-choice question. You can run Python to compute. "
    'Finish by calling finish with the letter of your choice, e.g. finish(answer="B").'
)
VALUE_PROMPT = (
    "Answer the question. You can run Python to compute. Give the final value with its unit "
    'where it has one, in \\boxed{}, and call finish with it, e.g. finish(answer="\\boxed{9.8 m/s^2}").'
)


class StemKind(StemSpec, AgentTask):
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
