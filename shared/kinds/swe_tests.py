"""Which test runner a SWE-bench-style instance uses, what it is told to run, and which test ids it can name.

This follows what SWE-bench's harness does per repository: Django runs its
own `tests/runtests.py --verbosity 2` with module labels made from the test
files that the test patch touches (`tests/a/test_b.py` -> `a.test_b`), and
its test ids are what that runner prints (`test_x (a.test_b.SomeTests)`, or
the first line of a test's docstring); sympy runs `bin/test -C --verbose`
over those files and names tests by function name (`test_issue_123`);
every other repository runs pytest, whose ids are node ids
(`path/to/test_x.py::Class::test`). A test id the runner could never report
is refused at submission: it would score 0 whatever the patch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.tasks.base import TaskValidationError

RUNNERS = ("django", "sympy", "pytest")
REPO_RUNNERS = {"django/django": "django", "sympy/sympy": "sympy"}
# Files of a test patch that are data, not tests (SWE-bench's list).
_NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
_DIFF_TARGET = re.compile(r"^diff --git a/.* b/(.*)$", re.MULTILINE)
DJANGO_ID = re.compile(r"^(\w+) \(([\w.]+)\)$")
SYMPY_ID = re.compile(r"^test_\w*$")
PYTEST_ID = re.compile(r"^[^\s:]+\.py(::\S.*)?$")
# Django before 1.10 has no --parallel (SWE-bench runs 1.9 without its settings flags).
_DJANGO_PLAIN_VERSIONS = {"1.9"}


@dataclass(frozen=True)
class TestPlan:
    runner: str
    labels: tuple[str, ...]  # what the runner is told to run: files, Django module labels


def runner_for(repo: str, override: str | None) -> str:
    """The runner of a repository: the task's `test_runner`, else SWE-bench's choice for `repo`."""
    if override is not None:
        if override not in RUNNERS:
            raise TaskValidationError(f"task.test_runner: one of {', '.join(RUNNERS)}")
        return override
    return REPO_RUNNERS.get(repo, "pytest")


def patch_test_files(test_patch: str) -> list[str]:
    """The files a test patch creates or changes, minus data files (SWE-bench's test directives)."""
    files = _DIFF_TARGET.findall(test_patch)
    return [f for f in dict.fromkeys(files) if not f.endswith(_NON_TEST_EXTS)]


def _is_django_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name == "tests.py" or name.startswith("test_") or "/tests/" in path or "/test_" in path


def django_module(path: str) -> str:
    """`tests/a/test_b.py` -> `a.test_b`: the label Django's runtests.py takes for a file."""
    path = path.removesuffix(".py")
    path = path.removeprefix("tests/")
    return path.replace("/", ".")


def django_label(test_id: str) -> str | None:
    """The runtests.py label of a `name (module.Class)` id (newer Django prints `name (module.Class.name)`)."""
    match = DJANGO_ID.match(test_id)
    if match is None:
        return None
    name, dotted = match.groups()
    return dotted if dotted.endswith(f".{name}") else f"{dotted}.{name}"


def plan_tests(instance_id: str, runner: str, test_patch: str, test_ids: tuple[str, ...]) -> TestPlan:
    """The runner's labels for these ids; raises TaskValidationError naming the instance and the first id
    that this runner could never report."""

    def refuse(test_id: str, why: str) -> TaskValidationError:
        return TaskValidationError(
            f"task.FAIL_TO_PASS/PASS_TO_PASS: instance {instance_id}: test id {test_id!r} cannot be run by the "
            f"{runner} runner: {why}"
        )

    files = patch_test_files(test_patch)
    if any(f.startswith("-") or "/-" in f for f in files):  # runner arguments, never options
        raise TaskValidationError(f"task.test_patch: instance {instance_id}: a test file path with a part starting '-'")
    if runner == "pytest":
        for test_id in test_ids:
            if not PYTEST_ID.match(test_id):
                raise refuse(test_id, "a pytest node id is path/to/test_file.py[::name]")
        return TestPlan(runner, tuple(sorted({t.split("::", 1)[0] for t in test_ids})))
    if runner == "sympy":
        labels = tuple(f for f in files if f.endswith(".py"))
        for test_id in test_ids:
            if not SYMPY_ID.match(test_id):
                raise refuse(test_id, "bin/test names a test by its function name, test_...")
            if not labels:
                raise refuse(test_id, "the test patch names no test file to run it from")
        return TestPlan(runner, labels)
    modules = [django_module(f) for f in files if _is_django_test_file(f)]
    labels = list(modules)
    for test_id in test_ids:
        label = django_label(test_id)
        if label is None:
            # A docstring line: runtests.py prints it for a test in one of the patch's modules.
            if PYTEST_ID.match(test_id):
                raise refuse(test_id, "a pytest node id; runtests.py names a test `name (module.Class)`")
            if not modules:
                raise refuse(test_id, "not `name (module.Class)`, and the test patch names no test module")
            continue
        if not any(label == m or label.startswith(m + ".") for m in labels):
            labels.append(label)
    return TestPlan(runner, tuple(labels))


def django_command(python: str, version: str | None, labels: tuple[str, ...]) -> list[str]:
    """SWE-bench's Django test command (settings and --parallel 1, except on 1.9) over `labels`."""
    argv = [python, "tests/runtests.py", "--verbosity", "2"]
    if version not in _DJANGO_PLAIN_VERSIONS:
        argv += ["--settings=test_sqlite", "--parallel", "1"]
    return [*argv, *labels]


def sympy_command(python: str, labels: tuple[str, ...]) -> list[str]:
    """SWE-bench's sympy test command over the test patch's files."""
    return [python, "bin/test", "-C", "--verbose", *labels]
