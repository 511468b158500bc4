"""Rewards of answer tasks (math, STEM): extract the answer, compare it, say what happened.

Each grader returns the reward and the details a user needs to trust it:
what was extracted and from where, the reference, how they compared, and
`reason`, one sentence saying all that.
"""

from __future__ import annotations

from typing import Any

from shared.kinds.numbers import plain_final_answer
from workers.eval.answers import choice_letter, math_answer
from workers.eval.math_equiv import CHECK_TIMEOUT_S, equivalent
from workers.eval.quantities import UnitError, parse_quantity, same_quantity

DEFAULT_REL_TOL = 0.01


def _graded(reward: float, details: dict[str, Any], match: str) -> dict[str, Any]:
    """The grader's result with its one-line `reason`."""
    if details["extracted"] is None:
        reason = f"{match}; reference {details['reference']!r}"
    else:
        verdict = "matches" if reward == 1.0 else "does not match"
        reason = (
            f"answer {details['extracted']!r} (from {details['source']}) {verdict} "
            f"reference {details['reference']!r} ({match})"
        )
    return {"reward": reward, **details, "match": match, "reason": reason}


def grade_math(final_text: str, answer: str | None, reference: str, timeout: float = CHECK_TIMEOUT_S) -> dict[str, Any]:
    """1.0 if the extracted answer (workers/eval/answers.py) is mathematically equivalent to `reference`."""
    found = math_answer(final_text, answer)
    details: dict[str, Any] = {"extracted": found.text, "source": found.source, "reference": reference}
    if found.text is None:
        if answer is not None and _is_text_answer(answer, reference):
            # "New York City" reads as a sentence with no number, yet it is a text answer given whole.
            verdict = equivalent(plain_final_answer(answer), reference, timeout)
            if verdict.equivalent:
                return _graded(1.0, {**details, "extracted": answer.strip(), "source": "finish"}, verdict.reason)
        return _graded(0.0, details, f"no answer: {found.note}")
    verdict = equivalent(found.text, reference, timeout)
    return _graded(1.0 if verdict.equivalent else 0.0, details, verdict.reason)


def _is_text_answer(answer: str, reference: str) -> bool:
    """Whether a finish argument with nothing extractable may still be the answer itself: the reference is
    words (no digit), and the argument is short enough to be one."""
    return not any(c.isdigit() for c in reference) and len(answer.split()) <= max(2 * len(reference.split()), 4)


def grade_choice(final_text: str, answer: str | None, choices: dict[str, str], reference: str) -> dict[str, Any]:
    """1.0 if the picked letter is the reference letter."""
    found = choice_letter(final_text, answer, choices)
    details: dict[str, Any] = {"extracted": found.text, "source": found.source, "reference": reference}
    if found.text is None:
        return _graded(0.0, details, "no answer: no choice letter found")
    right = found.text == reference
    return _graded(1.0 if right else 0.0, details, "letter" if right else "different")


def grade_value(
    final_text: str,
    answer: str | None,
    reference: str,
    rel_tol: float = DEFAULT_REL_TOL,
    timeout: float = CHECK_TIMEOUT_S,
) -> dict[str, Any]:
    """1.0 if the stated value equals `reference`: as quantities with units where the reference
    is a number (within `rel_tol`; a bare number is read in the reference's unit), else by
    mathematical equivalence."""
    found = math_answer(final_text, answer, with_units=True)
    details: dict[str, Any] = {"extracted": found.text, "source": found.source, "reference": reference}
    if found.text is None:
        return _graded(0.0, details, f"no answer: {found.note}")
    try:
        expected = parse_quantity(reference)
    except UnitError:
        expected = None
    if expected is not None:
        try:
            given = parse_quantity(found.text)
        except UnitError as exc:
            given = None
            unit_error = str(exc)
        if given is not None:
            same = same_quantity(given, expected, rel_tol)
            return _graded(1.0 if same else 0.0, details, "quantity" if same else "different")
        if expected.has_unit:
            return _graded(0.0, details, f"unreadable quantity: {unit_error}")
    verdict = equivalent(found.text, reference, timeout)
    return _graded(1.0 if verdict.equivalent else 0.0, details, verdict.reason)
