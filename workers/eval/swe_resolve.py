"""Resolve a SWE-bench-style instance: the agent's diff on a fresh checkout, tests from the task.

Like SWE-bench's harness: apply the agent's patch to the repository at the
base commit, put every test file the test patch touches (and every test file
the agent's patch touched) back to its base version, apply the test patch,
run the tests, and call the instance resolved only if every FAIL_TO_PASS and
every PASS_TO_PASS test passes. So an agent that edits or deletes tests
changes nothing. Everything after the fresh checkout runs inside the eval
sandbox (the agent's patch is untrusted: symlinks, hooks, odd paths).

The test runner is the repository's own, as SWE-bench's harness runs it
(shared/kinds/swe_tests.py): Django's runtests.py with module labels, sympy's
bin/test, pytest for the rest. Per-test outcomes of pytest come from its JUnit
XML report (xunit1, which keeps file paths), not from the text output that the
code under test can print into; Django's and sympy's runners write no report,
so their verbose logs are parsed as SWE-bench parses them (workers/eval/swe_logs.py).

A test counts only if it *passed*: unlike SWE-bench, an xfail is not a pass
(for FAIL_TO_PASS nor PASS_TO_PASS), since a ``pytest.xfail()`` call in the
agent's source turns any failing test into an xfail.

The agent's diff must not replace the test tooling: files that shadow pytest
or run at interpreter start-up (pytest.py, py.py, a pytest/ or _pytest/
package, sitecustomize.py, usercustomize.py, *.pth) are put back to the base
like test files, every file a FAIL_TO_PASS/PASS_TO_PASS node id names is
restored too (whatever its name), and pytest is started without the working
directory first on sys.path (a bootstrap moves it last, so installed packages
win over same-named files in the repository, on any Python version; ``python
-P`` would drop it altogether, and a repository that is not installed could not
import itself).
"""

from __future__ import annotations

import os
import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from shared.kinds.swe_instance import SweInstance, patch_paths
from shared.kinds.swe_tests import TestPlan, django_command, sympy_command
from workers.eval.fresh_sandbox import EvalBox, pytest_env
from workers.eval.swe_logs import parse_django_log, parse_sympy_log

GIT_TIMEOUT_S = 120.0
MAX_REPORT_BYTES = 20 * 1024 * 1024
MAX_LOG_BYTES = 16 * 1024 * 1024
# SWE-bench runs sympy's tests with these warnings silenced (they would interleave with the verbose lines).
_SYMPY_WARNINGS = "ignore::UserWarning,ignore::SyntaxWarning"
PASSING = {"passed"}
_SHADOW_NAMES = {"pytest.py", "py.py", "sitecustomize.py", "usercustomize.py"}
_SHADOW_DIRS = {"pytest", "_pytest", "py"}
# Run pytest with the working directory (the agent's repository root) last on sys.path, not first:
# installed packages (pytest itself) win over same-named files there; the repository stays importable.
_PYTEST_BOOT = (
    "import os, sys\n"
    "if sys.path and sys.path[0] in ('', '.', os.getcwd()):\n"
    "    del sys.path[0]\n"
    "sys.path.append(os.getcwd())\n"
    "import pytest\n"
    "sys.exit(pytest.main(sys.argv[1:]))\n"
)
_TEST_PATH = re.compile(
    r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_tests?\.py$|(^|/)conftest\.py$|(^|/)(pytest|tox)\.ini$"
)


def is_test_path(path: str) -> bool:
    """Paths that decide test outcomes rather than implement the fix."""
    return bool(_TEST_PATH.search(path))


def shadows_tooling(path: str) -> bool:
    """Paths that would replace pytest or run at interpreter start-up if the agent wrote them."""
    parts = path.split("/")
    return parts[-1] in _SHADOW_NAMES or parts[-1].endswith(".pth") or any(p in _SHADOW_DIRS for p in parts[:-1])


def _text(diff: str | bytes) -> str:
    """The diff as text, for reading its paths (the bytes themselves are what gets applied)."""
    return diff if isinstance(diff, str) else diff.decode("utf-8", errors="replace")


def restore_set(instance: SweInstance, agent_diff: str | bytes) -> list[str]:
    """Files put back to the base commit before the test patch: the test patch's own, the files the
    FAIL_TO_PASS/PASS_TO_PASS node ids name, and any test or tooling-shadowing file the agent touched."""
    paths = list(instance.test_files)
    pytest_ids = instance.test_plan().runner == "pytest"  # only pytest ids name their files
    for test in (*instance.fail_to_pass, *instance.pass_to_pass) if pytest_ids else ():
        path = test.split("::", 1)[0]
        if path and path not in paths:
            paths.append(path)
    for path in patch_paths(_text(agent_diff)):
        if (is_test_path(path) or shadows_tooling(path)) and path not in paths:
            paths.append(path)
    return paths


def resolve(
    box: EvalBox, instance: SweInstance, agent_diff: str | bytes, python: str, test_timeout_s: float
) -> dict[str, Any]:
    """Judge the diff (text, or exact bytes for a change in another encoding) in `box` (a fresh sandbox
    over the repository at base, probed with pytest importable); returns reward and details."""
    details: dict[str, Any] = {"instance_id": instance.instance_id, "resolved": False}

    touched = patch_paths(_text(agent_diff))
    details["files_changed"] = touched
    if any(p == ".git" or p.startswith(".git/") for p in touched):
        return {
            "reward": 0.0,
            **details,
            "patch_applied": False,
            "error": "the agent's patch touches .git",
            "reason": "the patch touches .git",
        }
    if agent_diff.strip():
        raw = agent_diff if isinstance(agent_diff, bytes) else agent_diff.encode("utf-8")
        (box.runtime / "agent.diff").write_bytes(raw)
        applied = box.run(
            ["git", "apply", "--binary", "--whitespace=nowarn", str(box.runtime / "agent.diff")], GIT_TIMEOUT_S
        )
        if not applied.ok:
            error = f"the agent's patch does not apply: {(applied.stderr or applied.stdout)[-1000:]}"
            return {"reward": 0.0, **details, "patch_applied": False, "error": error, "reason": error}
    details["patch_applied"] = True

    restored = restore_set(instance, agent_diff)
    details["restored_test_files"] = restored
    (box.runtime / "test.patch").write_text(instance.test_patch)
    script = [_restore_command(path) for path in restored]
    if instance.test_patch.strip():
        script.append(f"git apply --whitespace=nowarn {shlex.quote(str(box.runtime / 'test.patch'))}")
    prepared = box.run("set -e\n" + "\n".join(script or ["true"]), GIT_TIMEOUT_S)
    if not prepared.ok:
        # It applied to the clean base at init; only the agent's changes can have broken it.
        error = f"the test patch no longer applies after the agent's changes: {prepared.stderr[-1000:]}"
        return {"reward": 0.0, **details, "error": error, "reason": error}

    tests = {"FAIL_TO_PASS": list(instance.fail_to_pass), "PASS_TO_PASS": list(instance.pass_to_pass)}
    plan = instance.test_plan()
    if plan.runner == "pytest":
        ids = [*instance.fail_to_pass, *instance.pass_to_pass]
        outcomes, run_info = run_pytest(box, ids, python, test_timeout_s)
    else:
        outcomes, run_info = run_logged(box, plan, instance.version, python, test_timeout_s)
    details.update(run_info)
    for group, ids in tests.items():
        details[group] = {test: outcomes.get(test, "missing") for test in ids}
    resolved = all(outcome in PASSING for group in tests for outcome in details[group].values())
    details["resolved"] = resolved
    details["reason"] = _reason(details, tests)
    return {"reward": 1.0 if resolved else 0.0, **details}


def _reason(details: dict[str, Any], tests: dict[str, list[str]]) -> str:
    """One line: how many of each group passed, and the first tests that did not."""
    counts = []
    failing = []
    for group, ids in tests.items():
        outcomes = details[group]
        counts.append(f"{sum(1 for o in outcomes.values() if o in PASSING)}/{len(ids)} {group} passed")
        failing += [f"{test}: {outcome}" for test, outcome in outcomes.items() if outcome not in PASSING]
    verdict = "resolved" if details["resolved"] else "not resolved"
    return f"{verdict} ({details['runner']}): {', '.join(counts)}" + (
        f"; not passing: {'; '.join(failing[:5])}" if failing else ""
    )


def run_logged(
    box: EvalBox, plan: TestPlan, version: str | None, python: str, timeout_s: float
) -> tuple[dict[str, str], dict[str, Any]]:
    """Run Django's or sympy's own runner over the plan's labels; outcomes parsed from its log."""
    if plan.runner == "django":
        argv, parse = django_command(python, version, plan.labels), parse_django_log
        env = ""
    else:
        argv, parse = sympy_command(python, plan.labels), parse_sympy_log
        env = f"PYTHONWARNINGS={shlex.quote(_SYMPY_WARNINGS)} "
    command = " ".join(shlex.quote(a) for a in argv)
    result = box.run(f"{env}exec {command} 2>&1", timeout_s, output_cap=MAX_LOG_BYTES)
    outcomes = parse(result.stdout)
    info: dict[str, Any] = {
        "runner": plan.runner,
        "test_command": env + command,
        "test_exit_code": result.exit_code,
        "test_timed_out": result.timed_out,
    }
    if not outcomes or result.timed_out:
        info["test_output"] = result.stdout[-2000:]
    return outcomes, info


def _restore_command(path: str) -> str:
    """Shell that puts `path` back as it is at the base commit (deleting it if the base has none)."""
    quoted = shlex.quote(path)
    return f"rm -rf -- {quoted}; git cat-file -e HEAD:{quoted} 2>/dev/null && git checkout -q HEAD -- {quoted}; true"


def run_pytest(
    box: EvalBox, test_ids: list[str], python: str, timeout_s: float
) -> tuple[dict[str, str], dict[str, Any]]:
    """Run the files holding `test_ids` once; outcome per node id from the JUnit report."""
    files = sorted({test.split("::", 1)[0] for test in test_ids})
    report = box.runtime / "report.xml"
    argv = [
        python,
        "-c",
        _PYTEST_BOOT,
        "--rootdir=.",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-o",
        "junit_family=xunit1",
        f"--junitxml={report}",
        "-q",
        "--tb=short",
        "--",
        *files,
    ]
    result = box.run(argv, timeout_s, env=pytest_env(python))
    info: dict[str, Any] = {
        "runner": "pytest",
        "test_command": " ".join(["pytest", *files]),
        "test_exit_code": result.exit_code,
        "test_timed_out": result.timed_out,
    }
    outcomes = parse_junit(report)
    if not outcomes:
        info["test_output"] = (result.stdout + result.stderr)[-2000:]
    return outcomes, info


def parse_junit(report: Path) -> dict[str, str]:
    """node id -> passed | failed | error | skipped | xfailed, from an xunit1 report ({} if none)."""
    try:
        fd = os.open(report, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_REPORT_BYTES)
    try:
        root = ET.fromstring(data)
    except ET.ParseError:
        return {}
    outcomes: dict[str, str] = {}
    for case in root.iter("testcase"):
        node_id = _node_id(case.get("file") or "", case.get("classname") or "", case.get("name") or "")
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
                break
            if child.tag == "skipped":
                outcome = "xfailed" if (child.get("type") or "") == "pytest.xfail" else "skipped"
        previous = outcomes.get(node_id)
        if previous is None or previous in ("passed", "xfailed"):  # a teardown error after a pass still fails it
            outcomes[node_id] = outcome
    return outcomes


def _node_id(file: str, classname: str, name: str) -> str:
    module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
    rest = classname[len(module) + 1 :] if module and classname.startswith(module + ".") else ""
    parts = [file, *[p for p in rest.split(".") if p], name]
    return "::".join(parts)
