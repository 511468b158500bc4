"""A code task's hidden tests as written in the task: stdin/stdout cases, assert snippets and the `test_*`
functions of a pytest-style `test_code` module. Read here, where the API checks them at submission;
run by workers/eval/code_tests.py."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any


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
