"""The easier SmolLM2 rows (examples/smollm2/arith_rows.py): valid tasks of their kinds, graded right only when right."""

from __future__ import annotations

import random

import pytest

from examples.smollm2.arith_rows import arith_task, choice_task
from shared.kinds.stem import choices_of
from workers.eval.answer_grading import grade_choice, grade_math
from workers.kinds.math import MathKind, reference_answer
from workers.kinds.stem import StemKind


def test_a_choice_row_has_four_distinct_choices_and_its_letter_is_the_result() -> None:
    rng = random.Random(0)
    for _ in range(500):  # "What is 4 - 4?" among them: a result of 0 still gets three wrong choices
        task = choice_task(rng)
        StemKind().validate(task)
        choices = choices_of(task)
        assert len(set(choices.values())) == 4 and all(int(v) >= 0 for v in choices.values())
        assert grade_choice(task["answer"], None, choices, task["answer"])["reward"] == 1.0
        wrong = next(letter for letter in choices if letter != task["answer"])
        assert grade_choice(wrong, None, choices, task["answer"])["reward"] == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_a_gsm8k_row_is_graded_by_its_final_number(seed: int) -> None:
    task = arith_task(random.Random(seed))
    MathKind().validate(task)
    final = task["answer"].rsplit("#### ", 1)[1]
    assert reference_answer(task) == final
    assert grade_math(f"\\boxed{{{final}}}", None, reference_answer(task))["reward"] == 1.0
    assert grade_math(f"\\boxed{{{int(final) + 1}}}", None, reference_answer(task))["reward"] == 0.0
