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
workspace (`run_case`), so nothing one test run writes (a rewritten
.eval/_hidden_tests.py, a shadowing module, a patched harness) reaches the
next.

An assert test passes only if the harness prints a per-run token after the
test returned. The token never enters the process that runs the solution:
the shell opens the token file on fd 3 and deletes it, the harness forks a
child that closes fd 3 and only then imports the solution and runs the test,
and the parent (which never imports the solution, and makes itself
non-dumpable so the child cannot read its memory) reads the token after the
fork and prints it only if the child exited 0 after reporting, through a pipe,
that the test returned. It is not a global, not in the environment
(/proc/self/environ), and not on disk once the solution runs. What remains
possible is what any in-process test allows: a solution that imitates the
harness's own report (or fools the asserts with objects whose ``__eq__`` always
holds); the token only stops the cheap forgeries.
"""

from __future__ import annotations

import ast
import secrets
import shlex
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.eval.fresh_sandbox import EvalBox
from workers.sandbox.workspace import place_files

EVAL_DIR = ".eval"
HARNESS = f"{EVAL_DIR}/harness.py"
TOKEN_FILE = f"{EVAL_DIR}/token"
TEST_MODULE = "_hidden_tests"
DETAIL_CHARS = 400

_HARNESS_SOURCE = '''\
"""Runs one assert test in a child; the parent prints the token (read from fd 3) only if it returned."""
import ctypes, importlib, os, sys, traceback

TOKEN_FD = 3


def run_test(mode, target, module):
    eval_dir = os.path.join(os.getcwd(), ".eval")
    sys.path[:0] = [eval_dir, os.getcwd()]
    if mode == "snippet":
        with open(target) as handle:
            source = handle.read()
        namespace = {"__name__": "__hidden_test__"}
        exec("from %s import *" % module, namespace)
        exec(compile(source, "<hidden test>", "exec"), namespace)
    else:
        getattr(importlib.import_module("_hidden_tests"), target)()


def main():
    mode, target, module = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.stdout.flush()
    sys.stderr.flush()
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(TOKEN_FD)
        os.close(report_r)
        try:
            run_test(mode, target, module)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os.write(report_w, b"returned")
        os._exit(0)
    os.close(report_w)
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the child cannot read this memory
    except Exception:
        pass
    token = os.read(TOKEN_FD, 256).decode().strip()
    os.close(TOKEN_FD)
    report = b""
    while True:
        chunk = os.read(report_r, 64)
        if not chunk or len(report) > 64:
            break
        report += chunk
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and report == b"returned":
        sys.stdout.write("\\n" + token + " PASS\\n")
        sys.stdout.flush()
        os._exit(0)
    os._exit(1)


main()
'''


@dataclass
class TestCase:
    name: str
    stdin: str | None = None  # stdio case
    stdout: str | None = None
    snippet: str | None = None  # assert snippet
    function: str | None = None  # test_* function of test_code


@dataclass
class CodeTests:
    cases: list[TestCase]
    test_code: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # the init state's files (starter code, data)


def parse_tests(task: dict[str, Any]) -> CodeTests:
    """The task's tests as TestCases; raises ValueError naming the bad field."""
    cases: list[TestCase] = []
    for i, raw in enumerate(task.get("tests") or []):
        if not isinstance(raw, dict):
            raise ValueError(f"task.tests[{i}]: an object with stdin/stdout or code")
        name = str(raw.get("name") or f"test_{i}")
        if "code" in raw:
            if not isinstance(raw["code"], str):
                raise ValueError(f"task.tests[{i}].code: a string of Python")
            cases.append(TestCase(name, snippet=raw["code"]))
        elif "stdout" in raw:
            if not isinstance(raw.get("stdin", ""), str) or not isinstance(raw["stdout"], str):
                raise ValueError(f"task.tests[{i}]: stdin and stdout must be strings")
            cases.append(TestCase(name, stdin=raw.get("stdin", ""), stdout=raw["stdout"]))
        else:
            raise ValueError(f"task.tests[{i}]: needs 'stdout' (with 'stdin') or 'code'")
    test_code = task.get("test_code")
    if test_code is not None:
        if not isinstance(test_code, str):
            raise ValueError("task.test_code: a string (a pytest-style module)")
        try:
            tree = ast.parse(test_code)
        except SyntaxError as exc:
            raise ValueError(f"task.test_code: not valid Python: {exc}") from None
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                cases.append(TestCase(node.name, function=node.name))
    if not cases:
        raise ValueError("task.tests / task.test_code: at least one test")
    return CodeTests(cases, test_code)


def populate(
    workspace: Path,
    tests: CodeTests,
    init_files: dict[str, str],
    entry: str,
    solution: str,
    token: str | None = None,
) -> None:
    """The judged state: the init files, the agent's solution over them, the harness and test inputs.

    `token` (for one assert test) goes to .eval/token, which the test's shell opens and deletes
    before the harness starts.
    """
    place_files(workspace, {**init_files, entry: solution})
    eval_files = {HARNESS: _HARNESS_SOURCE}
    if tests.test_code is not None:
        eval_files[f"{EVAL_DIR}/{TEST_MODULE}.py"] = tests.test_code
    for i, case in enumerate(tests.cases):
        if case.stdin is not None:
            eval_files[f"{EVAL_DIR}/case_{i}.in"] = case.stdin
        if case.snippet is not None:
            eval_files[f"{EVAL_DIR}/case_{i}.py"] = case.snippet
    if token is not None:
        eval_files[TOKEN_FILE] = token
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

    Nothing a test run writes survives into the next one.
    """
    results = []
    for i in range(len(tests.cases)):
        token = secrets.token_hex(16)

        def fill(workspace: Path, token: str = token) -> None:
            populate(workspace, tests, init_files, entry, solution, token)

        with open_box(fill) as box:
            results.append(run_case(box, tests, i, entry, python, timeout_s, token))
    return results


def run_case(
    box: EvalBox, tests: CodeTests, index: int, entry: str, python: str, timeout_s: float, token: str
) -> dict[str, Any]:
    """Run case `index` (an assert test reads `token` from .eval/token, written by populate)."""
    module = Path(entry).with_suffix("").as_posix().replace("/", ".")
    case = tests.cases[index]
    if case.stdin is not None:
        command = f"exec {_q(python)} {_q(entry)} < {EVAL_DIR}/case_{index}.in"
        cap = max(64 * 1024, 2 * len(case.stdout or "") + 1024)
        return _stdio_result(case, box.run(command, timeout_s, output_cap=cap))
    if case.snippet is not None:
        mode, target = "snippet", f"{EVAL_DIR}/case_{index}.py"
    else:
        mode, target = "function", str(case.function)
    command = (
        f"exec 3< {TOKEN_FILE} && rm -f {TOKEN_FILE} && "
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
    if scoring == "all":
        reward = 1.0 if passed == total else 0.0
    else:
        reward = passed / total
    return {"reward": reward, "passed": passed, "total": total, "scoring": scoring, "tests": results}
