"""Answers read the way the field writes them: GSM8K answer sentences ("The answer is $6."), MATH's \\boxed{},
"#### N" lines, a sentence's last number; each with the rule that fired, graded by the math kind on rows in
the published schemas."""

from __future__ import annotations

from typing import Any

import pytest

from shared.kinds.formats import row_to_task
from shared.kinds.numbers import plain_final_answer
from shared.tasks import get_kind, load_task_modules
from workers.eval.answers import is_sentence, math_answer

from .conftest import MakeCtx

load_task_modules()


def gsm8k_row(final: str) -> dict[str, Any]:
    """A row in GSM8K's schema (`question`, `answer` with a worked solution ending in "#### N")."""
    return {
        "question": "A shop had some items and sold some of them. How many are left?",
        "answer": f"It had <<a=b>> items.\nSo it is {final}.\n#### {final}",
    }


def evaluate(make_ctx: MakeCtx, row: dict[str, Any], output: str) -> dict[str, Any]:
    """The math kind's reward of `output` given as the finish argument, exactly as a `given` job scores it."""
    task = row_to_task(row)
    kind = get_kind(task["kind"])
    kind.validate(task)
    return kind.evaluate(make_ctx(task, outputs={"rollout": kind.given_rollout(task, output)}))


@pytest.mark.parametrize(
    ("reference", "output", "source"),
    [
        ("15", "Janet has 20 and gives away 5, so 15 are left. The answer is 15.", "finish.phrase"),
        ("6", "The answer is $6.", "finish.phrase"),
        ("17,500", "The answer is 17,500.", "finish.phrase"),
        ("60", "The answer is $60.00", "finish.phrase"),
        ("60", "Answer: $60", "finish.phrase"),
        ("72", "Final answer: 72", "finish.phrase"),
        ("72", "**Final Answer:** 72 clips", "finish.phrase"),
        ("3", "First the answer is 2, no wait. The answer is 3.", "finish.phrase"),  # the last phrase
        ("42", "She had 40 and found 2 more, so she has 42 marbles now.", "finish.last_number"),
        ("1200", "In total 1,200 meters are walked.", "finish.last_number"),
        ("72", "Natalia sold 48 + 24 clips.\n#### 72", "finish.marker"),
        ("72", "\\boxed{72}", "finish.boxed"),
        ("72", "72", "finish"),
        ("1,000", "$1,000.", "finish"),
        ("2.5", "2.50", "finish"),
        ("15", "15 dollars", "finish"),  # a number and its words, not a sentence
        ("15", "$15 per hour", "finish"),
        ("15", "$15 per hour.", "finish.last_number"),
        ("-3", "The temperature fell to -3 degrees, so the answer is -3.", "finish.phrase"),
    ],
)
def test_right_gsm8k_answers_in_the_published_forms_score_1(
    make_ctx: MakeCtx, reference: str, output: str, source: str
) -> None:
    result = evaluate(make_ctx, gsm8k_row(reference), output)
    assert (result["reward"], result["source"]) == (1.0, source), result


@pytest.mark.parametrize(
    ("reference", "output"),
    [
        ("15", "so 14 are left. The answer is 14."),
        ("6", "The answer is $7."),
        ("17,500", "The answer is 17,501."),
        ("60", "The answer is $60.01"),
        ("3", "The answer is 3. Wait, it is 4. The answer is 4."),  # the last phrase counts, not the first
        ("42", "She had 40 and found 2 more, so she has 43 marbles now."),
        ("72", "#### 73"),
        ("1200", "1,2000"),
    ],
)
def test_wrong_gsm8k_answers_score_0(make_ctx: MakeCtx, reference: str, output: str) -> None:
    assert evaluate(make_ctx, gsm8k_row(reference), output)["reward"] == 0.0


def test_a_sentence_with_no_answer_is_a_0_that_says_so(make_ctx: MakeCtx) -> None:
    result = evaluate(make_ctx, gsm8k_row("15"), "I could not work this one out, sorry.")
    assert result["reward"] == 0.0 and result["extracted"] is None and result["source"] == "none"
    assert "sentence with no number" in result["reason"], result


def test_the_final_message_is_read_when_finish_gives_nothing(make_ctx: MakeCtx) -> None:
    task = row_to_task(gsm8k_row("17,500"))
    kind = get_kind("math")
    for text, source in [
        ("Adding up, the total is 17,500.\nThe answer is 17,500.", "final_text.phrase"),
        ("Adding up gives 17,500.\n#### 17,500", "final_text.marker"),
        ("So the total is $\\boxed{17500}$.", "final_text.boxed"),
    ]:
        result = kind.evaluate(make_ctx(task, outputs={"rollout": {"final_text": text, "answer": None}}))
        assert (result["reward"], result["source"]) == (1.0, source), result
    silent = kind.evaluate(make_ctx(task, outputs={"rollout": {"final_text": "Let me think.", "answer": None}}))
    assert silent["reward"] == 0.0 and "no answer" in silent["reason"]


def test_math_rows_read_the_same_rules(make_ctx: MakeCtx) -> None:
    math_row = {
        "problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.",
        "level": "Level 1",
        "type": "Algebra",
        "solution": "We get $\\frac{2}{4}+\\frac{1}{4}=\\boxed{\\frac{3}{4}}$.",
    }
    plain_row = {"problem": "How many sides has a hexagon?", "answer": "6"}
    assert evaluate(make_ctx, math_row, "The answer is $\\frac{3}{4}$.")["reward"] == 1.0
    assert evaluate(make_ctx, math_row, "So the final answer is 0.75.")["reward"] == 1.0
    assert evaluate(make_ctx, math_row, "The answer is $\\frac{2}{3}$.")["reward"] == 0.0
    assert evaluate(make_ctx, plain_row, "A hexagon has 6 sides.")["source"] == "finish.last_number"
    assert evaluate(make_ctx, plain_row, "A hexagon has 6 sides.")["reward"] == 1.0
    assert evaluate(make_ctx, plain_row, "A hexagon has 5 sides.")["reward"] == 0.0


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("$1,000.00.", "1000"),
        ("2.50", "2.5"),
        ("7.", "7"),
        ("\\$60", "60"),
        ("€1,234", "1234"),
        ("-$5", "-5"),
        ("(1,234)", "(1,234)"),
        ("\\frac{1}{2}.", "\\frac{1}{2}"),
        ("100", "100"),
        ("10.0", "10"),
        ("0.0", "0"),
    ],
)
def test_numbers_are_normalised_only_when_the_answer_is_one_number(text: str, plain: str) -> None:
    assert plain_final_answer(text) == plain


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("15", False),
        ("x = 4", False),
        ("New York", False),
        ("\\text{Monday}", False),
        ("15 apples", False),
        ("\\frac{\\sqrt{3}}{2}", False),
        ("so 15 are left.", True),
        ("It is 15.", True),
        ("Bob has 15 now", True),
    ],
)
def test_what_counts_as_a_sentence(text: str, sentence: bool) -> None:
    assert is_sentence(text) is sentence


def test_a_number_times_a_constant_is_not_cut() -> None:
    assert math_answer("", "3 pi").text == "3 pi" and math_answer("", "The answer is 2 sqrt 2.").text == "2 sqrt 2"


def test_units_keep_their_words() -> None:
    """For values with units (the stem kind) "9000 mJ" is not cut to "9000", and no last number is guessed."""
    assert math_answer("", "the final answer is 9000 mJ.", with_units=True).text == "9000 mJ"
    assert math_answer("", "The wavelength is 500 nm.", with_units=True).source == "finish"


def test_a_text_answer_of_several_words_given_whole_is_read_as_the_answer(make_ctx: MakeCtx) -> None:
    """Three words with no number read as a sentence, but a words-only reference is compared with them whole."""
    row = {"problem": "Which city is called the Big Apple?", "answer": "New York City"}
    right = evaluate(make_ctx, row, "New York City")
    assert (right["reward"], right["source"]) == (1.0, "finish"), right
    wrong = evaluate(make_ctx, row, "Los Angeles, California, USA")
    assert wrong["reward"] == 0.0 and wrong["extracted"] is None, wrong
    assert evaluate(make_ctx, gsm8k_row("15"), "I could not work this one out.")["extracted"] is None
