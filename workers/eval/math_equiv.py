"""Mathematical equivalence of two answers (LaTeX or plain), decided by math-verify.

Hugging Face's math-verify (the grader of open-r1 and TRL's accuracy reward, with
latex2sympy2-extended underneath) parses both answers and compares them as
numbers, expressions, sets, intervals, tuples, matrices, equations or text. We
keep around it what it does not do for us:

- our own extraction (workers/eval/answers.py): math-verify sees one answer,
  wrapped in ``\\boxed{}``, never a whole model output;
- two spellings it misses, as documented extensions (docs/TASKS.md, the
  agreement table): the degree sign ``30°`` and thin-space thousands
  separators ``1\\,200``;
- refusals before anything is parsed: answers over 400 characters, power
  towers (``9^{9^{9^9}}``) and integer exponents over 10,000, which sympy could
  spend hours or all memory on;
- the time limit: `equivalent` decides in a child process (from a forkserver
  that preloaded sympy and math-verify; never a fork of a worker process whose
  other threads may hold locks), under resource limits (no file writes, no new
  processes, bounded memory and CPU). A check that overruns, or a child that
  dies, raises EquivalenceUndecided: the job fails as an evaluation error
  instead of recording a reward of 0 that nobody decided. math-verify's own
  timeouts are off (``parsing_timeout=None``, ``timeout_seconds=None``): they
  use SIGALRM, which works only in a main thread, and a timeout inside
  math-verify returns "not equivalent", an undecided 0.

Only math-verify's LaTeX extraction is used: its plain-expression extraction
hands text to sympy's parse_expr, which evals it, and a model writes that text.
"""

from __future__ import annotations

import logging
import multiprocessing
import re
from dataclasses import dataclass
from typing import Any

from math_verify import LatexExtractionConfig, parse, verify

from shared.errors import RolloutsError
from shared.kinds.latex import braced

MAX_ANSWER_CHARS = 400
MAX_EXPONENT = 10_000
CHECK_TIMEOUT_S = 20.0
CHILD_MEMORY_BYTES = 2 << 30
_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0),)
# math-verify warns once that its timeouts are off; they are off on purpose (module docstring).
logging.getLogger("math_verify").setLevel(logging.ERROR)


class EquivalenceUndecided(RolloutsError, RuntimeError):
    """The check did not finish (time limit, or its process died): an evaluation error, not a 0."""


@dataclass
class Verdict:
    equivalent: bool
    reason: str  # "equivalent", "text", "different", or why it could not be decided


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
        context.set_forkserver_preload(["workers.eval.math_equiv", "workers.eval.math_warmup"])
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
    if answer.strip() == reference.strip():
        return Verdict(True, "text")
    try:
        refuse_expensive(answer)
    except ValueError as exc:
        return Verdict(False, f"refused: {exc}")
    gold = parse(_boxed(reference), extraction_config=_EXTRACTION, parsing_timeout=None)
    given = parse(_boxed(answer), extraction_config=_EXTRACTION, parsing_timeout=None)
    if not gold:
        return Verdict(False, "the reference could not be read")
    if not given:
        return Verdict(False, "the answer could not be read")
    if verify(gold, given, timeout_seconds=None):
        return Verdict(True, "equivalent")
    return Verdict(False, "different")


# Extensions: spellings the agreement table found math-verify missing (docs/TASKS.md).
_DEGREE_SIGN = re.compile(r"\s*°")
_THIN_SPACE_THOUSANDS = re.compile(r"(?<=\d)\\,(?=\d{3}(?!\d))")


def _boxed(text: str) -> str:
    """`text` as math-verify reads one answer: in a \\boxed{}, with our extensions' spellings rewritten."""
    text = _DEGREE_SIGN.sub(lambda _: "^\\circ", text.strip())
    text = _THIN_SPACE_THOUSANDS.sub("", text)
    return f"\\boxed{{{text}}}"


def refuse_expensive(text: str) -> None:
    """Raise ValueError for a power tower or an integer exponent over MAX_EXPONENT, before sympy sees it."""
    plain = text.replace("**", "^")
    for match in re.finditer(r"\^", plain):
        exponent, after = _exponent(plain, match.end())
        if "^" in exponent and not re.search(r"(?<!\\)\b[a-zA-Z]", re.sub(r"\\[a-zA-Z]+", " ", exponent)):
            raise ValueError("power tower too large to check")
        if plain[after:].lstrip().startswith("^") and not re.search(r"[a-zA-Z]", exponent):
            raise ValueError("power tower too large to check")  # 9^9^9: an unbraced tower
        digits = re.sub(r"[\s{}()+]", "", exponent)
        if digits.isdigit() and int(digits) > MAX_EXPONENT:
            raise ValueError("exponent too large to check")


def _exponent(text: str, start: int) -> tuple[str, int]:
    """The exponent after a ``^`` at `start` (a braced group, a number, or one character) and where it ends."""
    while start < len(text) and text[start] == " ":
        start += 1
    if start < len(text) and text[start] == "{":
        body = braced(text, start)
        if body is not None:
            return body
    number = re.match(r"[-+]?\d+", text[start:])
    if number:
        return number.group(0), start + number.end()
    return text[start : start + 1], start + 1
