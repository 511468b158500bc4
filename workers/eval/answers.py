"""Where an agent's final answer is: the finish tool's argument, a \\boxed{}, or an "answer is" phrase.

The finish argument is the agent's explicit answer, so it is read first; the
last assistant text is the fallback. Every extractor reports where it found
the answer, so a reward of 0 can be told apart from "no answer was given".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from workers.eval.latex import last_boxed, unwrap_text


@dataclass
class Extracted:
    text: str | None
    source: str  # "finish.boxed", "finish", "finish.marker", "final_text.boxed", "final_text.marker", "final_text.phrase", "none"


def plain_final_answer(text: str) -> str:
    """'1,000.' -> '1000': GSM8K writes thousands separators; a trailing period ends the sentence."""
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text.strip()).rstrip(".").strip()


def trajectory_texts(trajectory: dict[str, Any]) -> tuple[str, str | None]:
    """(final assistant text, finish-tool answer or None) of a rollout's trajectory."""
    final_text = trajectory.get("final_text") or ""
    answer = trajectory.get("answer")
    return (final_text if isinstance(final_text, str) else str(final_text)), (
        answer if isinstance(answer, str) and answer.strip() else None
    )


_MARKER = re.compile(r"^\s*####\s*(.+?)\s*$", re.MULTILINE)


def boxed_answer(final_text: str, answer: str | None) -> Extracted:
    """For tasks that ask for \\boxed{}: boxed in the finish answer, boxed in the text, the finish answer,
    then a GSM8K-style "#### N" line of the text (how GSM8K writes its answers)."""
    if answer is not None:
        boxed = last_boxed(answer)
        if boxed is not None:
            return Extracted(boxed, "finish.boxed")
    boxed = last_boxed(final_text)
    if boxed is not None:
        return Extracted(boxed, "final_text.boxed")
    if answer is not None:
        marked = _MARKER.findall(answer)
        return Extracted(plain_final_answer(marked[-1]), "finish.marker") if marked else Extracted(answer.strip(), "finish")
    markers = _MARKER.findall(final_text)
    if markers:
        return Extracted(plain_final_answer(markers[-1]), "final_text.marker")
    return Extracted(None, "none")


_PHRASE = re.compile(r"(?:final answer|answer)\s*(?:is|:|=)\s*:?\s*(.+)", re.IGNORECASE)


def stated_answer(final_text: str, answer: str | None) -> Extracted:
    """For short answers: like `boxed_answer`, then the text after the last "the answer is"."""
    found = boxed_answer(final_text, answer)
    if found.text is not None:
        return found
    matches = _PHRASE.findall(final_text)
    if matches:
        phrase = matches[-1].strip().splitlines()[0].strip().rstrip(".").strip("*").strip()
        return Extracted(phrase, "final_text.phrase")
    return Extracted(None, "none")


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
    if match and match.group(1).upper() in letters:
        # "B" or "(B) the text of B"; a lowercase word like "a plant" is not a letter
        if match.group(1).isupper() or len(plain) <= 3:
            return match.group(1).upper()
    key = _norm(plain)
    for letter, text in choices.items():
        if key and key == _norm(text):
            return letter
    return None


def _norm(text: str) -> str:
    return re.sub(r"[\s.$]+", "", unwrap_text(text)).lower()
