"""Hidden tests of a code task, run against the agent's solution file in a fresh sandbox.

Two kinds of test, mixable in one task:
- stdin/stdout cases: ``python <entry> < input``; passes if it exits 0 and its
  output equals the expected one (trailing whitespace per line ignored);
- assert tests: a snippet of Python run after ``from <module> import *``, or a
  ``test_*`` function of a pytest-style ``test_code`` module; passes if it
  returns without raising.

Every test runs in its own process with the task's time limit and the
sandbox's rlimits (memory, CPU), so an infinite loop or a memory hog fails
that test only. The expected outputs never enter the sandbox.

Every test also runs in its own fresh sandbox over a freshly populated
workspace that holds only that test's own files (`run_isolated`), so nothing
one test run writes reaches the next, and no test's source is there for the
solution to read.

An assert test is judged by `split_harness.py`: the solution runs in a
process of its own and the test in the judge's, which reads the test's
source and a per-run token from file descriptors the solution's process
never holds, and calls the solution's functions over a socket that carries
plain data only. The judge prints the token after the test returned; the
solution can neither read the token nor make the judge's comparisons lie
(see that module's docstring for what crosses and what stays behind).
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from shared.kinds.code_tests import CodeTests, TestCase
from workers.eval.fresh_sandbox import EvalBox
from workers.sandbox.workspace import place_files

EVAL_DIR = ".eval"
HARNESS = f"{EVAL_DIR}/harness.py"
TOKEN_FILE = f"{EVAL_DIR}/token"
TEST_SOURCE = f"{EVAL_DIR}/test.py"
DETAIL_CHARS = 400

# The judge that runs an assert test with the solution in another process (standard library only).
_HARNESS_SOURCE = (Path(__file__).parent / "split_harness.py").read_text()


def populate(
    workspace: Path,
    tests: CodeTests,
    init_files: dict[str, str],
    entry: str,
    solution: str,
    index: int,
    token: str,
) -> None:
    """The judged state of case `index`: the init files, the agent's solution over them, and only
    this case's own input. An assert test's source and `token` go to .eval/, which the test's shell
    opens (fds 4 and 3) and deletes before anything runs, so the solution never sees either.
    """
    place_files(workspace, {**init_files, entry: solution})
    case = tests.cases[index]
    if case.stdin is not None:
        eval_files = {f"{EVAL_DIR}/case_{index}.in": case.stdin}
    else:
        source = case.snippet if case.snippet is not None else tests.test_code
        eval_files = {HARNESS: _HARNESS_SOURCE, TEST_SOURCE: source or "", TOKEN_FILE: token}
    place_files(workspace, eval_files)


OpenBox = Callable[[Callable[[Path], None]], AbstractContextManager[EvalBox]]


def run_isolated(
    open_box: OpenBox,
    tests: CodeTests,
    init_files: dict[str, str],
    entry: str,
    solution: str,
    python: str,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """Every case in its own fresh sandbox: `open_box(populate_fn)` gives a new box over a new workspace.

    Nothing a test run writes survives into the next one, and no case's files are there for another's.
    """
    results = []
    for i in range(len(tests.cases)):
        token = secrets.token_hex(16)

        def fill(workspace: Path, index: int = i, token: str = token) -> None:
            populate(workspace, tests, init_files, entry, solution, index, token)

        with open_box(fill) as box:
            results.append(run_case(box, tests, i, entry, python, timeout_s, token))
    return results


def run_case(
    box: EvalBox, tests: CodeTests, index: int, entry: str, python: str, timeout_s: float, token: str
) -> dict[str, Any]:
    """Run case `index` (populated by `populate` with `token`)."""
    module = Path(entry).with_suffix("").as_posix().replace("/", ".")
    case = tests.cases[index]
    if case.stdin is not None:
        command = f"exec {_q(python)} {_q(entry)} < {EVAL_DIR}/case_{index}.in"
        cap = max(64 * 1024, 2 * len(case.stdout or "") + 1024)
        return _stdio_result(case, box.run(command, timeout_s, output_cap=cap))
    mode, target = ("snippet", "-") if case.snippet is not None else ("function", str(case.function))
    # The harness is read by Python before the solution exists as a process; the token and the test
    # are open on fds 3 and 4 and gone from the disk.
    command = (
        f"exec 3< {TOKEN_FILE} 4< {TEST_SOURCE} && rm -f {TOKEN_FILE} {TEST_SOURCE} && "
        f"exec {_q(python)} -I {HARNESS} {mode} {_q(target)} {_q(module)}"
    )
    return _assert_result(case, box.run(command, timeout_s), token)


def _q(text: str) -> str:
    return shlex.quote(text)


def _normalize(output: str) -> str:
    return "\n".join(line.rstrip() for line in output.strip("\n").splitlines()).rstrip()


def _stdio_result(case: TestCase, result: Any) -> dict[str, Any]:
    if result.timed_out:
        return {"name": case.name, "passed": False, "status": "timeout"}
    if result.exit_code != 0:
        return {"name": case.name, "passed": False, "status": "error", "detail": _tail(result.stderr, result.exit_code)}
    if result.truncated or _normalize(result.stdout) != _normalize(case.stdout or ""):
        return {"name": case.name, "passed": False, "status": "wrong_output", "detail": result.stdout[:DETAIL_CHARS]}
    return {"name": case.name, "passed": True, "status": "passed"}


def _assert_result(case: TestCase, result: Any, token: str) -> dict[str, Any]:
    if result.timed_out:
        return {"name": case.name, "passed": False, "status": "timeout"}
    last = result.stdout.rstrip("\n").rsplit("\n", 1)[-1]
    if result.exit_code == 0 and last == f"{token} PASS":
        return {"name": case.name, "passed": True, "status": "passed"}
    status = "failed" if "AssertionError" in result.stderr else "error"
    return {"name": case.name, "passed": False, "status": status, "detail": _tail(result.stderr, result.exit_code)}


def _tail(stderr: str, exit_code: int | None) -> str:
    text = stderr.strip()
    return text[-DETAIL_CHARS:] if text else f"exit status {exit_code}"


def summary(results: list[dict[str, Any]], scoring: str) -> dict[str, Any]:
    """The reward (fraction passed, or all-or-nothing) and the per-test record."""
    passed = sum(1 for r in results if r["passed"])
    total = len(results)
    reward = float(passed == total) if scoring == "all" else passed / total
    return {"reward": reward, "passed": passed, "total": total, "scoring": scoring, "tests": results}
