"""Mathematical equivalence of two answers (LaTeX or plain), decided with sympy.

An answer is parsed into a structure first (a union of intervals, a tuple, a
set, an equation, or one expression), then elements are compared by value:
exactly with ``simplify(a - b) == 0``, or numerically within a relative 1e-6
for decimals. Text that does not parse is compared as normalized text, so
"\\text{Monday}" still matches "Monday".

sympy can run for a very long time (or exhaust memory) on adversarial input
such as ``9^{9^{9^9}}``: huge powers are refused before sympy sees them, and
`equivalent` decides in a child process with a time limit. The children come
from a forkserver that preloaded sympy (fast, and never a fork of a worker
process whose other threads may hold locks). A check that still overruns, or
a child that dies, raises EquivalenceUndecided: the job fails as an
evaluation error instead of recording a reward of 0 that nobody decided.

sympy's parse_expr calls Python's eval on the text it is given, and that text
comes from the model. `parse_value` therefore admits only an allowlisted
syntax before parse_expr sees it (`check_safe_syntax`): ASCII digits,
arithmetic and comparison operators, parentheses, commas, whitespace, a dot
only inside a decimal number, and identifiers that are either a fixed set of
math function and constant names or plain symbol names (letters, one
``_subscript``); never quotes, ``__``, keywords such as lambda, attribute
access, or sympy's internal constructors. The expression is then evaluated in
a namespace with no builtins that holds only those names. The child process
also runs under resource limits (no file writes, no new processes, bounded
memory and CPU), as a second line of defence.
"""

from __future__ import annotations

import keyword
import multiprocessing
import re
from dataclasses import dataclass
from tokenize import TokenError
from typing import Any

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    standard_transformations,
)

from shared.errors import RolloutsError
from workers.eval.latex import drop_text, strip_decorations, to_sympy_syntax, unwrap_text

MAX_ANSWER_CHARS = 400
REL_TOL = 1e-6
MAX_EXPONENT = 10_000
CHECK_TIMEOUT_S = 20.0
CHILD_MEMORY_BYTES = 2 << 30
_TRANSFORMS = (*standard_transformations, implicit_multiplication_application, convert_xor)
_LOCALS = {"e": sympy.E, "i": sympy.I, "pi": sympy.pi, "oo": sympy.oo, "E": sympy.E, "I": sympy.I}
# Names an answer may use as functions (what latex.to_sympy_syntax emits, and a few more of sympy's).
_FUNCTIONS = {
    name: getattr(sympy, name)
    for name in (
        "sqrt", "cbrt", "root", "log", "ln", "exp", "sin", "cos", "tan", "cot", "sec", "csc",
        "asin", "acos", "atan", "acot", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
        "binomial", "factorial", "Abs", "floor", "ceiling", "gamma", "Max", "Min",
    )
}  # fmt: skip
# Names sympy's own transformations insert into the code they generate (never allowed in an answer).
_INTERNAL = {
    name: getattr(sympy, name)
    for name in (
        "Symbol", "Function", "Number", "Integer", "Rational", "Float", "Lambda", "factorial2",
        "Add", "Mul", "Pow", "Or", "And", "Not", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
    )
}  # fmt: skip
_ALLOWED_NAMES = set(_FUNCTIONS) | set(_LOCALS)
_SAFE_CHARS = re.compile(r"[0-9A-Za-z_+\-*/().,=<>! \t\n]*")
_DECIMAL = re.compile(r"(?<![A-Za-z0-9_.])(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?(?![A-Za-z0-9_.])")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYMBOL_NAME = re.compile(r"[A-Za-z]+[0-9]*(?:_[A-Za-z0-9]+)?")
_OPEN = {"(": ")", "[": "]", "{": "}"}


class EquivalenceUndecided(RolloutsError, RuntimeError):
    """The check did not finish (time limit, or its process died): an evaluation error, not a 0."""


@dataclass
class Verdict:
    equivalent: bool
    reason: str  # "exact", "numeric", "text", "different", or why it could not be decided


def equivalent(answer: str, reference: str, timeout: float = CHECK_TIMEOUT_S) -> Verdict:
    """Whether `answer` means the same as `reference`, decided within `timeout` seconds."""
    if len(answer) > MAX_ANSWER_CHARS:
        return Verdict(False, f"answer longer than {MAX_ANSWER_CHARS} characters")
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(sender, answer, reference, timeout))
    child.start()
    sender.close()
    try:
        if receiver.poll(timeout):
            verdict: Verdict = receiver.recv()
            return verdict
        raise EquivalenceUndecided(f"comparing {answer[:80]!r} with {reference[:80]!r} took over {timeout:g}s")
    except EOFError:
        raise EquivalenceUndecided(f"the equivalence check died (exit code {child.exitcode})") from None
    finally:
        receiver.close()
        child.kill()
        child.join()


_FORKSERVER: Any = None


def _context() -> Any:
    global _FORKSERVER
    if _FORKSERVER is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["sympy", "workers.eval.math_equiv"])
        _FORKSERVER = context
    return _FORKSERVER


def _limit_child(timeout: float) -> None:
    """Best-effort resource limits for the checking child: no files, no processes, bounded memory and CPU."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    limits = [
        (resource.RLIMIT_FSIZE, 0),
        (resource.RLIMIT_NPROC, 0),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_AS, CHILD_MEMORY_BYTES),
        (resource.RLIMIT_CPU, int(timeout) + 2),
    ]
    for which, value in limits:
        try:
            _soft, hard = resource.getrlimit(which)
            cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (cap, cap))
        except (ValueError, OSError):
            pass


def _child(sender: Any, answer: str, reference: str, timeout: float = CHECK_TIMEOUT_S) -> None:
    _limit_child(timeout)
    try:
        sender.send(compare(answer, reference))
    except Exception as exc:  # noqa: BLE001 - any failure to decide is reported, not raised
        sender.send(Verdict(False, f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()


def compare(answer: str, reference: str) -> Verdict:
    """The comparison itself, in-process and without a time limit (use `equivalent`)."""
    a, b = strip_decorations(answer), strip_decorations(reference)
    if _text_key(a) == _text_key(b):
        return Verdict(True, "text")
    result = _compare_structures(_structure(a), _structure(b))
    if result is None:
        return Verdict(False, "different")
    return Verdict(True, result)


def _text_key(text: str) -> str:
    return re.sub(r"\s+", "", unwrap_text(text)).lower()


# --- structure ----------------------------------------------------------------


def split_top_level(text: str, separator: str = ",") -> list[str]:
    """Split at `separator` outside any brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == separator and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def _outer_brackets(text: str) -> tuple[str, str, str] | None:
    """(open, close, inside) if one bracket pair encloses the whole text (intervals may mix kinds)."""
    text = text.replace("\\{", "{").replace("\\}", "}")
    if len(text) < 2 or text[0] not in _OPEN or text[-1] not in ")]}":
        return None
    depth = 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0 and i != len(text) - 1:
                return None
    return text[0], text[-1], text[1:-1]


def _structure(text: str) -> Any:
    """("union", [...]) | ("seq", open, close, [...]) | ("eq", lhs, rhs) | ("expr", text)."""
    if "\\cup" in text:
        return ("union", [_structure(p.strip()) for p in text.split("\\cup")])
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        return ("expr", text.replace(",", ""))  # 1,000,000 and -1,200, not tuples
    brackets = _outer_brackets(text)
    inside = brackets[2] if brackets else text
    parts = split_top_level(inside)
    if len(parts) > 1 or (brackets and brackets[0] == "{" and brackets[1] == "}"):
        open_, close = (brackets[0], brackets[1]) if brackets else ("", "")
        return ("seq", open_, close, [_structure(p) for p in parts])
    if brackets and brackets[0] == "(" and brackets[1] == ")":
        return _structure(inside)
    lhs_rhs = split_top_level(text, "=")
    if len(lhs_rhs) == 2:
        return ("eq", lhs_rhs[0], lhs_rhs[1])
    return ("expr", text)


def _named_value(structure: Any) -> Any:
    """``x = 5`` answers 5: the right-hand side of an equation whose left side is one variable."""
    if structure[0] == "eq" and re.fullmatch(r"[a-zA-Z](_\{?\w+\}?)?", structure[1]):
        return _structure(structure[2])
    return None


def _compare_structures(a: Any, b: Any) -> str | None:
    """How a and b were found equal ("exact", "numeric", "text"), or None if they are not."""
    if a[0] == "expr" and b[0] == "seq" and len(b[3]) == 1:
        return _compare_structures(a, b[3][0])
    if b[0] == "expr" and a[0] == "seq" and len(a[3]) == 1:
        return _compare_structures(a[3][0], b)
    if a[0] != b[0]:
        if a[0] == "eq" and _named_value(a) is not None:
            return _compare_structures(_named_value(a), b)
        if b[0] == "eq" and _named_value(b) is not None:
            return _compare_structures(a, _named_value(b))
        return None
    if a[0] == "expr":
        return _compare_values(a[1], b[1])
    if a[0] == "eq":
        return _compare_equations(a[1], a[2], b[1], b[2])
    if a[0] == "union":
        return _compare_unordered(a[1], b[1])
    _, a_open, a_close, a_items = a
    _, b_open, b_close, b_items = b
    if len(a_items) != len(b_items):
        return None
    # Sets and bare lists ("1, 2" for "all solutions") are unordered; tuples and intervals are not.
    if {a_open, b_open} <= {"{", ""}:
        return _compare_unordered(a_items, b_items)
    bare = {a_open, b_open} == {"(", ""} and {a_close, b_close} == {")", ""}
    if (a_open, a_close) != (b_open, b_close) and not bare:
        return None
    reasons = [_compare_structures(x, y) for x, y in zip(a_items, b_items, strict=True)]
    return None if None in reasons else _weakest(reasons)


def _compare_unordered(a_items: list[Any], b_items: list[Any]) -> str | None:
    if len(a_items) != len(b_items):
        return None
    remaining = list(b_items)
    reasons = []
    for item in a_items:
        for j, other in enumerate(remaining):
            reason = _compare_structures(item, other)
            if reason is not None:
                reasons.append(reason)
                del remaining[j]
                break
        else:
            return None
    return _weakest(reasons)


def _weakest(reasons: list[str]) -> str:
    for reason in ("numeric", "text"):
        if reason in reasons:
            return reason
    return "exact"


# --- values -----------------------------------------------------------------


def parse_value(text: str) -> sympy.Expr:
    """One LaTeX or plain expression as sympy; raises ValueError/SyntaxError/TypeError if it is not one."""
    syntax = to_sympy_syntax(drop_text(text))
    if not syntax.strip():
        raise ValueError("empty expression")
    check_safe_syntax(syntax)
    unevaluated = _parse(syntax, evaluate=False)
    if not isinstance(unevaluated, sympy.Basic):
        raise TypeError(f"not an expression: {text!r}")
    _refuse_huge_powers(unevaluated)
    return _parse(syntax, evaluate=True)


def _parse(syntax: str, evaluate: bool) -> Any:
    namespace: dict[str, Any] = {"__builtins__": {}, **_INTERNAL, **_FUNCTIONS}
    return parse_expr(
        syntax, local_dict=dict(_LOCALS), global_dict=namespace, transformations=_TRANSFORMS, evaluate=evaluate
    )


def check_safe_syntax(syntax: str) -> None:
    """Refuse (ValueError) anything but plain arithmetic on allowlisted names: parse_expr evals its input."""
    if not _SAFE_CHARS.fullmatch(syntax):
        raise ValueError("characters outside the arithmetic allowlist")
    if "__" in syntax:
        raise ValueError("double underscore")
    without_numbers = _DECIMAL.sub(" 0 ", syntax)
    if "." in without_numbers:
        raise ValueError("a dot outside a decimal number")
    for name in _IDENTIFIER.findall(without_numbers):
        if name in _ALLOWED_NAMES:
            continue
        if name[0].isdigit() or keyword.iskeyword(name) or name in _INTERNAL or not _SYMBOL_NAME.fullmatch(name):
            raise ValueError(f"name {name!r} is not allowed in an answer")


def _refuse_huge_powers(expr: sympy.Basic) -> None:
    """Refuse power towers and huge integer exponents before sympy tries to evaluate them."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow):
            exponent = node.exp
            if isinstance(exponent, sympy.Pow) and exponent.is_number:
                raise ValueError("power tower too large to check")
            if exponent.is_Number and abs(exponent) > MAX_EXPONENT:
                raise ValueError("exponent too large to check")


def _compare_values(a_text: str, b_text: str) -> str | None:
    if _text_key(a_text) == _text_key(b_text):
        return "text"
    try:
        a, b = parse_value(a_text), parse_value(b_text)
    except (ValueError, SyntaxError, TypeError, TokenError, AttributeError, NameError):
        return None
    return _same_value(a, b)


def _same_value(a: sympy.Basic, b: sympy.Basic) -> str | None:
    if a == b:
        return "exact"
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        try:
            if sympy.simplify(a - b) == 0:
                return "exact"
        except (TypeError, ValueError, NotImplementedError):
            pass
        if not a.free_symbols and not b.free_symbols:
            try:
                x, y = complex(sympy.N(a, 30)), complex(sympy.N(b, 30))
            except (TypeError, ValueError):
                return None
            if abs(x - y) <= REL_TOL * max(1.0, abs(y)):
                return "numeric"
    return None


def _compare_equations(a_lhs: str, a_rhs: str, b_lhs: str, b_rhs: str) -> str | None:
    """Equations are equal if their (lhs - rhs) differ by a nonzero constant factor."""
    try:
        a = parse_value(a_lhs) - parse_value(a_rhs)
        b = parse_value(b_lhs) - parse_value(b_rhs)
    except (ValueError, SyntaxError, TypeError, TokenError, AttributeError, NameError):
        return _compare_values(f"{a_lhs}={a_rhs}", f"{b_lhs}={b_rhs}")
    if b == 0:
        return "exact" if a == 0 else None
    ratio = sympy.simplify(a / b)
    return "exact" if ratio.free_symbols == set() and ratio != 0 else None
