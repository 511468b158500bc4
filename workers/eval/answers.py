"""Where an agent's final answer is, read the way the field writes answers.

The finish argument is the agent's explicit answer, so it is read first; the
last assistant text is the fallback. The rules, in order: the last ``\\boxed{}``
(finish, then text); a GSM8K ``#### N`` line; the last "The answer is N" /
"Answer: N" / "Final answer: N" phrase (lm-evaluation-harness's GSM8K CoT
reading); then the finish argument itself, or, when it is a sentence, its last
number (lm-evaluation-harness's flexible reading). Numbers are normalised as
GSM8K writes them ("$1,200.00." -> "1200"). Every extractor reports which rule
fired (`Extracted.source`), so a reward of 0 can be told apart from "no answer
was given".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shared.kinds.latex import last_boxed, unwrap_text
from shared.kinds.numbers import CURRENCY, plain_final_answer


@dataclass
class Extracted:
    text: str | None
    # "finish.boxed", "final_text.boxed", "finish.marker", "finish.phrase", "finish", "finish.last_number",
    # "final_text.marker", "final_text.phrase", "none"
    source: str
    note: str = ""  # why nothing was found, when text is None


# A number inside prose: "17,500", "$6", "-3", "2.5", "3/4" (not the "1" of "x1", nor "3" of "3rd").
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])[-−]?" + CURRENCY + r"?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\w])")
# A number and then words ("15 apples", "$6 per hour"), not a number times a function or constant ("3 pi").
_LEADING_NUMBER = re.compile(
    r"\s*(" + _NUMBER_IN_TEXT.pattern + r")\s+(?!(?:pi|sqrt|log|ln|exp|sin|cos|tan|cot|sec|csc|i)\b)[A-Za-z]{2,}"
)
_MARKER = re.compile(r"^\s*####\s*(.+?)\s*$", re.MULTILINE)
# "The answer is 15", "Answer: 15", "**Final answer:** 15", "the answer = 15" (not "the answer isn't").
_PHRASE = re.compile(r"\banswer\b\s*(?:is\b|:|=)[\s:*]*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.\s|\.$")


def trajectory_texts(trajectory: dict[str, Any]) -> tuple[str, str | None]:
    """(final assistant text, finish-tool answer or None) of a rollout's trajectory."""
    final_text = trajectory.get("final_text") or ""
    answer = trajectory.get("answer")
    return (final_text if isinstance(final_text, str) else str(final_text)), (
        answer if isinstance(answer, str) and answer.strip() else None
    )


def is_sentence(text: str) -> bool:
    """Whether a finish argument is prose ("so 15 are left. The answer is 15.") rather than an answer
    ("15", "\\frac{1}{2}", "x = 4", "New York"): three words, or two and a final period; words inside
    LaTeX math and commands do not count."""
    prose = re.sub(r"\$[^$]*\$|\\\(.*?\\\)|\\[a-zA-Z]+", " ", text)
    words = re.findall(r"[A-Za-z]{2,}", prose)
    return len(words) >= 3 or (len(words) >= 2 and text.rstrip().endswith((".", "!", "?")))


def answer_phrase(text: str, with_units: bool = False) -> str | None:
    """What follows the last "the answer is" / "answer:" of `text`, up to the end of its sentence: a leading
    number when words follow it ("15 apples" -> "15"; not `with_units`: "9000 mJ"), else the phrase."""
    starts = [match.end() for match in _PHRASE.finditer(text)]
    lines = text[starts[-1] :].strip().splitlines() if starts else []
    if not lines:
        return None
    body = lines[0]
    end = _SENTENCE_END.search(body)
    body = (body[: end.start()] if end else body).strip().strip("*").strip()
    leading = None if with_units else _LEADING_NUMBER.match(body)
    if leading:
        body = leading.group(1)
    body = plain_final_answer(body)
    return body or None


def last_number(text: str) -> str | None:
    """The last number written in `text` ("... 17,500 left." -> "17500"), or None."""
    numbers = _NUMBER_IN_TEXT.findall(text)
    return plain_final_answer(numbers[-1]) if numbers else None


def math_answer(final_text: str, answer: str | None, with_units: bool = False) -> Extracted:
    """The answer to a math or short-answer question, by the first rule that finds one (module docstring).

    `with_units` (values with units, where "500 nm" is not "500"): words after a number are kept and a
    sentence given to finish is taken whole, with no last-number fallback."""
    if answer is not None:
        boxed = last_boxed(answer)
        if boxed is not None:
            return Extracted(plain_final_answer(boxed), "finish.boxed")
    boxed = last_boxed(final_text)
    if boxed is not None:
        return Extracted(plain_final_answer(boxed), "final_text.boxed")
    note = ""
    if answer is not None:
        found = _from_finish(answer, with_units)
        if found.text is not None:
            return found
        note = found.note
    stated = _marked_or_phrased(final_text, with_units, "final_text")
    if stated is not None:
        return stated
    return Extracted(None, "none", note or 'no \\boxed{}, "#### N" line, "the answer is" phrase or finish answer')


def _marked_or_phrased(text: str, with_units: bool, source: str) -> Extracted | None:
    """The text's last "#### N" line, else its "the answer is" phrase, labelled `<source>.marker` or `.phrase`."""
    marked = _MARKER.findall(text)
    if marked:
        return Extracted(plain_final_answer(marked[-1]), f"{source}.marker")
    phrase = answer_phrase(text, with_units)
    if phrase is not None:
        return Extracted(phrase, f"{source}.phrase")
    return None


def _from_finish(answer: str, with_units: bool) -> Extracted:
    """The finish argument's answer: its "####" line, its answer phrase, itself (the number of "15 dollars"),
    or a sentence's last number."""
    stated = _marked_or_phrased(answer, with_units, "finish")
    if stated is not None:
        return stated
    if with_units or not is_sentence(answer):
        leading = None if with_units else _LEADING_NUMBER.match(answer)
        return Extracted(plain_final_answer(leading.group(1) if leading else answer), "finish")
    number = last_number(answer)
    if number is not None:
        return Extracted(number, "finish.last_number")
    return Extracted(None, "none", "the finish argument is a sentence with no number and no answer phrase")


def choice_letter(final_text: str, answer: str | None, choices: dict[str, str]) -> Extracted:
    """The multiple-choice letter the agent picked, or None; a choice's full text counts as its letter."""
    letters = "".join(sorted(choices))
    for source, text in (("finish", answer), ("final_text", final_text)):
        if not text:
            continue
        letter = _letter_in(text, letters, choices, whole_text_ok=source == "finish")
        if letter is not None:
            return Extracted(letter, source)
    return Extracted(None, "none")


def _letter_in(text: str, letters: str, choices: dict[str, str], whole_text_ok: bool) -> str | None:
    candidates = []
    boxed = last_boxed(text)
    if boxed is not None:
        candidates.append(boxed)
    phrases = re.findall(r"answer\s*(?:is|:)\s*:?\s*(.+)", text, re.IGNORECASE)
    if phrases:
        candidates.append(phrases[-1].splitlines()[0])
    if whole_text_ok or len(text.strip()) <= 4:
        candidates.append(text)
    for candidate in candidates:
        letter = _as_letter(candidate, letters, choices)
        if letter is not None:
            return letter
    return None


def _as_letter(candidate: str, letters: str, choices: dict[str, str]) -> str | None:
    plain = unwrap_text(candidate).strip().strip("$*").strip()
    match = re.fullmatch(r"(?:option\s*|choice\s*)?\(?([A-Z])\)?[.:)]?(?:\s.*)?", plain, re.IGNORECASE | re.DOTALL)
    # "B" or "(B) the text of B"; a lowercase word like "a plant" is not a letter
    if match and match.group(1).upper() in letters and (match.group(1).isupper() or len(plain) <= 3):
        return match.group(1).upper()
    key = _norm(plain)
    for letter, text in choices.items():
        if key and key == _norm(text):
            return letter
    return None


def _norm(text: str) -> str:
    return re.sub(r"[\s.$]+", "", unwrap_text(text)).lower()
