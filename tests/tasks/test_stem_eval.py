"""STEM answers: choice letters however they are written, values with units, malformed answers."""

from __future__ import annotations

import pytest

from shared.tasks import TaskValidationError, get_kind, load_task_modules
from workers.eval.answer_grading import grade_choice, grade_value
from workers.eval.quantities import UnitError, parse_quantity, same_quantity

from .conftest import MakeCtx, rollout

load_task_modules()

CHOICES = {"A": "Oxygen", "B": "Nitrogen", "C": "Argon", "D": "Carbon dioxide"}


@pytest.mark.parametrize(
    ("final_text", "answer"),
    [
        ("", "B"),
        ("", "(B)"),
        ("", "B. Nitrogen"),
        ("", "nitrogen"),
        ("", "\\boxed{B}"),
        ("The answer is (B).", None),
        ("Oxygen is reactive... Answer: B", None),
        ("Final: \\boxed{\\text{B}}", None),
        ("B", None),
    ],
)
def test_choice_letter_forms(final_text: str, answer: str | None) -> None:
    result = grade_choice(final_text, answer, CHOICES, "B")
    assert result["reward"] == 1.0 and result["extracted"] == "B"


@pytest.mark.parametrize(
    ("final_text", "answer"),
    [("", "A"), ("The answer is (C).", None), ("", "Oxygen")],
)
def test_wrong_choice(final_text: str, answer: str | None) -> None:
    assert grade_choice(final_text, answer, CHOICES, "B")["reward"] == 0.0


@pytest.mark.parametrize(
    ("final_text", "answer"),
    [("", None), ("I am not sure, maybe a plant grows.", None), ("", "E"), ("", "a lot")],
)
def test_no_choice_found(final_text: str, answer: str | None) -> None:
    result = grade_choice(final_text, answer, CHOICES, "B")
    assert result["reward"] == 0.0 and result["extracted"] is None


@pytest.mark.parametrize(
    ("given", "reference"),
    [
        ("4 m/s^2", "4 m/s^2"),
        ("4.0 m s^{-2}", "4 m/s^2"),
        ("4", "4 m/s^2"),  # a bare number is read in the reference's unit
        ("0.004 km/s^2", "4 m/s^2"),
        ("9000 mJ", "9 J"),
        ("9 \\mathrm{kg\\,m^2/s^2}", "9 J"),
        ("72 km/h", "20 m/s"),
        ("29.2 g", "29.22 g"),  # within the default 1%
        ("3 \\times 10^{8} m/s", "3e8 m/s"),
        ("\\frac{1}{2}", "0.5"),
    ],
)
def test_values_with_units(given: str, reference: str) -> None:
    result = grade_value("", f"\\boxed{{{given}}}", reference)
    assert result["reward"] == 1.0, result


@pytest.mark.parametrize(
    ("given", "reference"),
    [("4 kg", "4 m/s^2"), ("5 m/s^2", "4 m/s^2"), ("28 g", "29.22 g"), ("4 furlongs", "4 m"), ("fast", "4 m/s")],
)
def test_wrong_values(given: str, reference: str) -> None:
    assert grade_value("", given, reference)["reward"] == 0.0


def test_value_from_answer_phrase() -> None:
    result = grade_value("Using F = ma, the final answer is 9 J.", None, "9 J")
    assert result["reward"] == 1.0 and result["source"] == "final_text.phrase"
    assert grade_value("I could not solve it.", None, "9 J")["extracted"] is None


def test_quantity_parsing() -> None:
    assert same_quantity(parse_quantity("1 atm"), parse_quantity("101.325 kPa"), 1e-6)
    assert not same_quantity(parse_quantity("1 kg"), parse_quantity("1 m"), 0.5)
    for bad in ["abc", "5 m^x", "5 m/", "5 (m"]:
        with pytest.raises(UnitError):
            parse_quantity(bad)


def test_stem_kind_multiple_choice_and_value(make_ctx: MakeCtx) -> None:
    kind = get_kind("stem")
    mc = {"kind": "stem", "question": "Most of the air is?", "choices": list(CHOICES.values()), "answer": "b"}
    value = {"kind": "stem", "question": "R for 12 V and 3 A?", "answer": "4", "unit": "ohm"}
    for task in (mc, value):
        kind.validate(task)
    assert "(B) Nitrogen" in kind.messages(mc)[1]["content"]
    assert kind.evaluate(make_ctx(mc, outputs=rollout("", "B")))["reward"] == 1.0
    assert kind.evaluate(make_ctx(value, outputs=rollout("", "\\boxed{4 \\Omega}")))["reward"] == 1.0
    assert kind.evaluate(make_ctx(value, outputs=rollout("", "\\boxed{4000 mohm}")))["reward"] == 1.0
    assert kind.evaluate(make_ctx(value, outputs=rollout("", "\\boxed{4 A}")))["reward"] == 0.0


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ({"kind": "stem", "answer": "B"}, "task.question"),
        ({"kind": "stem", "question": "q", "choices": ["x"], "answer": "A"}, "task.choices"),
        ({"kind": "stem", "question": "q", "choices": ["x", "y"], "answer": "C"}, "task.answer"),
        ({"kind": "stem", "question": "q"}, "task.answer"),
        ({"kind": "stem", "question": "q", "answer": "1", "rel_tol": 5}, "task.rel_tol"),
    ],
)
def test_validation_names_the_field(task: dict, field: str) -> None:
    with pytest.raises(TaskValidationError, match=field):
        get_kind("stem").validate(task)


@pytest.mark.parametrize("given", ["3 x 10^400 m", "2 km^999", "1e999 m", "5 m^-999"])
def test_out_of_range_quantities_are_unreadable_not_errors(given: str) -> None:
    with pytest.raises(UnitError):
        parse_quantity(given)
    result = grade_value(f"The answer is {given}.", given, "3 m")
    assert result["reward"] == 0.0
