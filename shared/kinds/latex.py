"""The LaTeX an answer extractor must see through: ``\\boxed{...}`` with nested braces, and ``\\text{...}``.

Parsing LaTeX into mathematics is math-verify's job (workers/eval/math_equiv.py);
this module only finds where an answer is and unwraps text macros.
"""

from __future__ import annotations

import re

_TEXT_MACROS = ("text", "textbf", "textit", "mathrm", "mathbf", "mbox", "operatorname", "mathit")
_TEXT_MACRO = re.compile(r"\\(?:" + "|".join(_TEXT_MACROS) + r")\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched; None if there is none."""
    best: str | None = None
    for match in re.finditer(r"\\(?:boxed|fbox)\s*", text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            body = braced(text, start)
            if body is not None:
                best = body[0]
        else:  # "\boxed 5": up to the next space or dollar sign
            tail = re.match(r"[^\s$]+", text[start:])
            if tail:
                best = tail.group(0)
    return best


def braced(text: str, start: int) -> tuple[str, int] | None:
    """Given text[start] == '{', the content up to the matching '}' and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def unwrap_text(text: str) -> str:
    """``\\text{foo}`` -> ``foo`` (and the other text-like macros)."""
    while True:
        match = _TEXT_MACRO.search(text)
        if not match:
            return text
        body = braced(text, match.end() - 1)
        if body is None:
            return text
        text = text[: match.start()] + body[0] + text[body[1] :]
