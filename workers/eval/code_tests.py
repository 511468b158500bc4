"""Hidden tests of a code task, run against the agent's solution file in a fresh sandbox.

Two kinds of test, mixable in one task:
- stdin/stdout cases: ``python <entry> < input``; passes if it exits 0 and its
  output equals the expected one (trailing whitespace per line ignored);
- assert tests: a snippet of Python run after ``from <module> import *``, or a
  ``test_*`` function of a pytest-style ``test_code`` module; passes if it
  returns without raising.

Every test runs in its own process with the task's time limit and the
sandbox's rlimits (memory, CPU), so an infinite loop or a memory hog fails
that test only. The expected outputs never enter the sandbox. A test passes
only if the harness prints a per-run token it removed from its environment
before importing the solution, so a solution that exits early with status 0
does not pass.
"""

from __future__ import annotations

import ast
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.sandbox.workspace import place_files
from workers.eval.fresh_sandbox import EvalBox

EVAL_DIR = ".eval"
HARNESS = f"{EVAL_DIR}/harness.py"
TEST_MODULE = "_hidden_tests"
DETAIL_CHARS = 400

_HARNESS_SOURCE = '''\
"""Runs one assert test; prints the token only if it passed."""
import importlib, os, sys
token = os.environ.pop("ROLLOUTS_EVAL_TOKEN", "")
sys.path.insert(0, os.getcwd())
sys.path.insert(1, os.path.join(os.getcwd(), ".eval"))
mode, target, module = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "snippet":
    with open(target) as handle:
        source = handle.read()
    namespace = {"__name__": "__hidden_test__"}
    exec("from %s import *" % module, namespace)
    exec(compile(source, "<hidden test>", "exec"), namespace)
else:
    getattr(importlib.import_module("_hidden_tests"), target)()
sys.stdout.flush()
sys.stdout.write("\\n" + token + " PASS\\n")
sys.stdout.flush()
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


def populate(workspace: Path, tests: CodeTests, init_files: dict[str, str], entry: str, solution: str) -> None:
    """The judged state: the init files, the agent's solution over them, the harness and test inputs."""
    place_files(workspace, {**init_files, entry: solution})
    eval_files = {HARNESS: _HARNESS_SOURCE}
    if tests.test_code is not None:
        eval_files[f"{EVAL_DIR}/{TEST_MODULE}.py"] = tests.test_code
    for i, case in enumerate(tests.cases):
        if case.stdin is not None:
            eval_files[f"{EVAL_DIR}/case_{i}.in"] = case.stdin
        if case.snippet is not None:
            eval_files[f"{EVAL_DIR}/case_{i}.py"] = case.snippet
    place_files(workspace, eval_files)


def run_tests(box: EvalBox, tests: CodeTests, entry: str, python: str, timeout_s: float) -> list[dict[str, Any]]:
    """Run every case in its own process; one result dict per case."""
    module = Path(entry).with_suffix("").as_posix().replace("/", ".")
    results = []
    for i, case in enumerate(tests.cases):
        if case.stdin is not None:
            command = f"exec {_q(python)} {_q(entry)} < {EVAL_DIR}/case_{i}.in"
            cap = max(64 * 1024, 2 * len(case.stdout or "") + 1024)
            result = box.run(command, timeout_s, output_cap=cap)
            results.append(_stdio_result(case, result))
        else:
            token = secrets.token_hex(16)
            if case.snippet is not None:
                mode, target = "snippet", f"{EVAL_DIR}/case_{i}.py"
            else:
                mode, target = "function", str(case.function)
            command = f"ROLLOUTS_EVAL_TOKEN={token} exec {_q(python)} {HARNESS} {mode} {_q(target)} {_q(module)}"
            result = box.run(command, timeout_s)
            results.append(_assert_result(case, result, token))
    return results


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
