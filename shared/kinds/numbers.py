"""A final answer's number as GSM8K writes it: what a published row's reference and an agent's answer
both become before they are compared (shared/kinds/formats.py, workers/eval/answers.py)."""

from __future__ import annotations

import re

CURRENCY = r"(?:\\\$|\$|€|£|¥)"
_PLAIN_NUMBER = re.compile(
    r"(?P<sign>[-−]?)\s*" + CURRENCY + r"?\s*(?P<sign2>[-−]?)(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?"
)


def plain_final_answer(text: str) -> str:
    """A final answer as GSM8K writes its numbers: '$1,000.00.' -> '1000', '2.50' -> '2.5', ' 7. ' -> '7'.

    Only a text that is one number (an optional currency sign before it) loses its separators, currency sign
    and trailing zeros after the point; any text loses surrounding space and a sentence's final period."""
    stripped = text.strip().rstrip(".").strip()
    match = _PLAIN_NUMBER.fullmatch(stripped)
    if not match:
        return stripped
    negative = bool(match.group("sign") or match.group("sign2"))
    digits = match.group("int").replace(",", "")
    fraction = (match.group("frac") or "").rstrip("0").rstrip(".")
    return ("-" if negative else "") + digits + fraction
