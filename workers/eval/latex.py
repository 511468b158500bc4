"""Turn the LaTeX a model writes for an answer into something sympy can parse.

No LaTeX parser ships with sympy's runtime dependencies (parse_latex needs
antlr4 or lark), and answers use a small subset anyway: fractions, roots,
powers, pi, infinity, a few functions. This rewrites that subset into sympy's
Python-like syntax; anything else stays text and is compared as text.
"""

from __future__ import annotations

import re

_SPACING = re.compile(r"\\[,;:!> ]|\\quad|\\qquad|~|\\displaystyle|\\limits")
_SIZING = re.compile(r"\\(left|right|big|Big|bigg|Bigg)(?![a-zA-Z])\s*")
_TEXT_MACROS = ("text", "textbf", "textit", "mathrm", "mathbf", "mbox", "operatorname", "mathit")
_TEXT_MACRO = re.compile(r"\\(?:" + "|".join(_TEXT_MACROS) + r")\s*\{")
_SIMPLE = {
    r"\cdot": "*",
    r"\times": "*",
    r"\div": "/",
    r"\pi": "pi",
    r"\infty": "oo",
    r"\infin": "oo",
    r"\ln": "log",
    r"\log": "log",
    r"\exp": "exp",
    r"\sin": "sin",
    r"\cos": "cos",
    r"\tan": "tan",
    r"\cot": "cot",
    r"\sec": "sec",
    r"\csc": "csc",
    r"\arcsin": "asin",
    r"\arccos": "acos",
    r"\arctan": "atan",
    r"\le": "<=",
    r"\ge": ">=",
    r"\leq": "<=",
    r"\geq": ">=",
    r"\neq": "!=",
    r"\pm": "+-",
}


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched; None if there is none."""
    best: str | None = None
    for match in re.finditer(r"\\(?:boxed|fbox)\s*", text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            body = _braced(text, start)
            if body is not None:
                best = body[0]
        else:  # "\boxed 5": up to the next space or dollar sign
            tail = re.match(r"[^\s$]+", text[start:])
            if tail:
                best = tail.group(0)
    return best


def _braced(text: str, start: int) -> tuple[str, int] | None:
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


def _argument(text: str, start: int) -> tuple[str, int] | None:
    """A macro argument at `start`: a braced group or a single character (``\\frac12``)."""
    while start < len(text) and text[start] == " ":
        start += 1
    if start >= len(text):
        return None
    if text[start] == "{":
        return _braced(text, start)
    if text[start] == "\\":
        name = re.match(r"\\[a-zA-Z]+", text[start:])
        if name:
            return name.group(0), start + len(name.group(0))
    return text[start], start + 1


def strip_decorations(text: str) -> str:
    """Remove what never changes an answer's value: dollars, spacing, sizing, degrees, percent."""
    s = text.strip().strip("$").strip()
    s = s.replace("\\$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s).replace("\\circ", "").replace("°", "")
    s = _SPACING.sub(" ", s)
    s = _SIZING.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\(?:begin|end)\{(?:array|aligned)\}(?:\{[^}]*\})?", "", s)
    return s.strip().rstrip(".").strip()


def unwrap_text(text: str) -> str:
    """``\\text{foo}`` -> ``foo`` (and the other text-like macros)."""
    pattern = _TEXT_MACRO
    while True:
        match = pattern.search(text)
        if not match:
            return text
        body = _braced(text, match.end() - 1)
        if body is None:
            return text
        text = text[: match.start()] + body[0] + text[body[1] :]


def drop_text(text: str) -> str:
    """Remove ``\\text{...}`` groups (units, words) when a value stands beside them."""
    pattern = _TEXT_MACRO
    out = text
    while True:
        match = pattern.search(out)
        if not match:
            break
        body = _braced(out, match.end() - 1)
        if body is None:
            break
        out = out[: match.start()] + " " + out[body[1] :]
    return out.strip() or text


def to_sympy_syntax(text: str) -> str:
    """Rewrite LaTeX math into sympy syntax; raises ValueError on unbalanced input."""
    s = text
    s = _rewrite_macro(s, "\\frac", 2, lambda a: f"(({a[0]})/({a[1]}))")
    s = _rewrite_macro(s, "\\binom", 2, lambda a: f"binomial({a[0]},{a[1]})")
    s = _rewrite_sqrt(s)
    for latex, plain in sorted(_SIMPLE.items(), key=lambda kv: -len(kv[0])):
        s = re.sub(re.escape(latex) + r"(?![a-zA-Z])", f" {plain} ", s)
    if re.search(r"\\[a-zA-Z]+", s):
        raise ValueError(f"unsupported LaTeX in {text!r}")
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    if s.count("(") != s.count(")"):
        raise ValueError(f"unbalanced brackets in {text!r}")
    return s


def _rewrite_macro(text: str, macro: str, nargs: int, build) -> str:  # type: ignore[no-untyped-def]
    """Replace every ``macro{a}{b}`` (innermost first, via recursion on the arguments)."""
    out = []
    i = 0
    pattern = re.compile(re.escape(macro) + r"(?![a-zA-Z])")
    while True:
        match = pattern.search(text, i)
        if not match:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i : match.start()])
        pos = match.end()
        args = []
        for _ in range(nargs):
            arg = _argument(text, pos)
            if arg is None:
                raise ValueError(f"{macro} without its arguments")
            args.append(_rewrite_macro(arg[0], macro, nargs, build))
            pos = arg[1]
        out.append(build(args))
        i = pos


def _rewrite_sqrt(text: str) -> str:
    out = []
    i = 0
    while True:
        j = text.find("\\sqrt", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        pos = j + len("\\sqrt")
        index = None
        if pos < len(text) and text[pos] == "[":
            close = text.find("]", pos)
            if close < 0:
                raise ValueError("\\sqrt[ without ]")
            index, pos = text[pos + 1 : close], close + 1
        arg = _argument(text, pos)
        if arg is None:
            raise ValueError("\\sqrt without an argument")
        body = _rewrite_sqrt(arg[0])
        out.append(f"sqrt({body})" if index is None else f"(({body})**(1/({index})))")
        i = arg[1]
