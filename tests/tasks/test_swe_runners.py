"""SWE-bench rows as published, run with each repository's own test runner (Django's runtests.py with test
labels, sympy's bin/test, pytest), in real sandboxes over small git repositories built here: the gold
patch resolves, an empty patch does not, and a test id the runner cannot report is refused up front."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.config import Settings, get_settings
from shared.kinds.swe_instance import SweInstance
from shared.kinds.swe_tests import django_label, patch_test_files, plan_tests
from shared.tasks import TaskValidationError, get_kind, load_task_modules
from tests.support.swe_repos import django_row, pytest_row, sympy_row
from workers.eval.swe_logs import parse_django_log, parse_sympy_log
from workers.sandbox.singularity import SingularitySandbox

from .conftest import MakeCtx, rollout

load_task_modules()
BUILDERS = {"django": django_row, "sympy": sympy_row, "pytest": pytest_row}


def _row(tmp_path: Path, runner: str) -> dict[str, Any]:
    row = BUILDERS[runner](tmp_path / f"repo-{runner}")
    return {**row, "repo_path": str(tmp_path / f"repo-{runner}")}


def _task(row: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "swe", "format": "swebench", **row}


@pytest.mark.usefixtures("require_bwrap")
@pytest.mark.parametrize("runner", ["django", "sympy", "pytest"])
def test_gold_patch_resolves_and_no_fix_or_an_empty_patch_does_not(
    runner: str, tmp_path: Path, make_ctx: MakeCtx
) -> None:
    task = _task(_row(tmp_path, runner))
    kind = get_kind("swe")
    kind.validate(task)
    kind.init(make_ctx(task, stage="init"))  # the test patch applies to the base
    gold = kind.evaluate(make_ctx(task, outputs={"rollout": kind.given_rollout(task, None)}))
    assert gold["reward"] == 1.0, gold
    assert gold["runner"] == runner and gold["reason"].startswith(f"resolved ({runner})")
    assert set(gold["FAIL_TO_PASS"].values()) == {"passed"} and set(gold["PASS_TO_PASS"].values()) == {"passed"}
    unfixed = kind.evaluate(make_ctx(task, outputs=rollout(diff=NO_FIX)))
    assert unfixed["reward"] == 0.0 and set(unfixed["FAIL_TO_PASS"].values()) == {"failed"}, unfixed
    assert set(unfixed["PASS_TO_PASS"].values()) == {"passed"}  # the runner ran; only the fix is missing
    assert "not resolved" in unfixed["reason"] and "FAIL_TO_PASS" in unfixed["reason"]
    empty = kind.evaluate(make_ctx(task, outputs=rollout(diff="")))
    assert empty["reward"] == 0.0 and empty["empty_patch"] is True, empty  # SWE-bench's harness runs no test


# A change that fixes nothing: the runner runs and the fix is missing.
NO_FIX = (
    "diff --git a/NOTES.md b/NOTES.md\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 @@\n+notes\n"
)


def test_django_labels_come_from_the_test_patch_and_the_ids(tmp_path: Path) -> None:
    row = _row(tmp_path, "django")
    plan = SweInstance.from_task(row).test_plan()
    assert plan.runner == "django" and plan.labels == ("calc_tests.test_add",)
    assert patch_test_files(row["test_patch"]) == ["tests/calc_tests/test_add.py"]
    assert django_label("test_a (x.tests.T)") == "x.tests.T.test_a"
    assert django_label("test_a (x.tests.T.test_a)") == "x.tests.T.test_a"  # newer Django / Python
    other = plan_tests("i", "django", row["test_patch"], ("test_b (other_tests.tests.T)",))
    assert other.labels == ("calc_tests.test_add", "other_tests.tests.T.test_b")


@pytest.mark.parametrize(
    ("runner", "change", "bad_id"),
    [
        ("django", {"FAIL_TO_PASS": json.dumps(["tests/test_x.py::test_a"])}, None),
        ("django", {"test_patch": "", "FAIL_TO_PASS": json.dumps(["Adds two numbers."])}, "Adds two numbers."),
        ("sympy", {"FAIL_TO_PASS": json.dumps(["sympy/core/tests/test_x.py::test_a"])}, None),
        ("sympy", {"test_patch": ""}, "test_double"),
        ("pytest", {"PASS_TO_PASS": json.dumps(["test_x (a.B)"])}, "test_x (a.B)"),
        ("pytest", {"FAIL_TO_PASS": json.dumps(["[100%]"])}, "[100%]"),
    ],
)
def test_a_test_id_the_runner_cannot_report_is_refused(
    runner: str, change: dict[str, Any], bad_id: str | None, tmp_path: Path
) -> None:
    row = {**_row(tmp_path, runner), **change}
    bad_id = bad_id or json.loads(change["FAIL_TO_PASS"])[0]
    with pytest.raises(TaskValidationError) as caught:
        get_kind("swe").validate(_task(row))
    message = str(caught.value)
    assert row["instance_id"] in message and repr(bad_id) in message and f"the {runner} runner" in message


def test_django_log_parser() -> None:
    log = (
        "test_adds (calc_tests.test_add.AddTests) ... ok\n"
        "test_documented (calc_tests.test_add.AddTests)\nAdding nothing changes nothing. ... ok\n"
        "test_bad (calc_tests.test_add.AddTests) ... FAIL\n"
        "test_broken (calc_tests.test_add.AddTests) ... ERROR\n"
        "test_noisy (calc_tests.test_add.AddTests) ... printed by the test\nok\n"
        "test_skip (calc_tests.test_add.AddTests) ... skipped 'no db'\n"
    )
    assert parse_django_log(log) == {
        "test_adds (calc_tests.test_add.AddTests)": "passed",
        "Adding nothing changes nothing.": "passed",
        "test_bad (calc_tests.test_add.AddTests)": "failed",
        "test_broken (calc_tests.test_add.AddTests)": "error",
        "test_noisy (calc_tests.test_add.AddTests)": "passed",
        "test_skip (calc_tests.test_add.AddTests)": "skipped",
    }


def test_django_log_parser_cannot_be_talked_into_a_pass() -> None:
    """The patched code can print runner-like lines: a failure stays a failure, and an `ok` in the
    tracebacks after the summary passes nothing."""
    log = (
        "test_bad (calc_tests.test_add.AddTests) ... FAIL\n"
        "test_bad (calc_tests.test_add.AddTests) ... ok\n"  # forged by the patched code
        "test_last (calc_tests.test_add.AddTests) ... \n"
        "======================================================================\n"
        "FAIL: test_last (calc_tests.test_add.AddTests)\n"
        "Traceback (most recent call last):\n"
        "    ok = check()\n"
        "ok\n"
        "----------------------------------------------------------------------\n"
        "Ran 2 tests in 0.001s\n"
    )
    assert parse_django_log(log) == {
        "test_bad (calc_tests.test_add.AddTests)": "failed",
        "test_last": "failed",
    }


def test_sympy_log_parser() -> None:
    log = "symp/tests/test_core.py[3] \ntest_a ok\ntest_b F\ntest_c E\n____ symp/tests/test_core.py:test_b ____\n"
    assert parse_sympy_log(log) == {
        "test_a": "passed",
        "test_b": "failed",
        "test_c": "error",
        "symp/tests/test_core.py:test_b": "failed",
    }


@pytest.mark.usefixtures("require_bwrap")
def test_rows_without_repo_path_come_from_the_mirror(
    tmp_path: Path, make_ctx: MakeCtx, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = django_row(tmp_path / "mirror" / "django__django")  # as published: no repo_path
    task = _task(row)
    with pytest.raises(TaskValidationError, match=r"task\.repo_path.*swe_repo_mirror"):
        get_kind("swe").validate(task)
    monkeypatch.setenv("ROLLOUTS_SWE_REPO_MIRROR", str(tmp_path / "mirror"))
    get_settings.cache_clear()
    try:
        get_kind("swe").validate(task)
        gold = get_kind("swe").evaluate(make_ctx(task, outputs={"rollout": get_kind("swe").given_rollout(task, None)}))
        assert gold["reward"] == 1.0, gold
    finally:
        monkeypatch.delenv("ROLLOUTS_SWE_REPO_MIRROR")
        get_settings.cache_clear()


def test_singularity_uses_the_official_image_at_testbed(tmp_path: Path, short_dir: Path) -> None:
    row = {**_row(tmp_path, "django"), "instance_id": "django__django-11099"}
    settings = Settings(state_dir=tmp_path / "state", sandbox_backend="singularity")
    spec = get_kind("swe").sandbox_spec(_task(row), settings)
    assert spec.image == "docker://swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert spec.workdir == "/testbed" and spec.env["PATH"].startswith("/opt/miniconda3/envs/testbed/bin:")
    (short_dir / "rt").mkdir()
    box = SingularitySandbox(spec, tmp_path / "ws", short_dir / "rt", settings)
    argv = box.wrap(["true"], {})
    assert f"{box.workspace}:/testbed:rw" in argv and argv[argv.index("--pwd") + 1] == "/testbed"
    own = get_kind("swe").sandbox_spec(_task({**row, "image": "/images/x.sif"}), settings)
    assert own.image == "/images/x.sif" and own.workdir == "/testbed"
    local = get_kind("swe").sandbox_spec(_task(row), Settings(state_dir=tmp_path / "s2"))
    assert local.image is None and local.workdir is None


def test_given_patch_without_gold_is_refused(tmp_path: Path) -> None:
    row = {k: v for k, v in _row(tmp_path, "pytest").items() if k != "patch"}
    with pytest.raises(TaskValidationError, match=r"task\.patch"):
        get_kind("swe").given_rollout(_task(row), None)
    assert get_kind("swe").given_rollout(_task(row), "diff")["extra"] == {"diff": "diff"}


FAKE_APPTAINER = """#!/usr/bin/env python3
# Test double of `apptainer exec` (Apptainer is not installable here): the image file holds the path of a
# directory standing for the image's root; bound paths and /testbed become host paths; the command runs.
import subprocess, sys
args, binds, i = sys.argv[1:], {}, 1
while args[i].startswith("-"):
    if args[i] in ("--bind", "--pwd", "--env-file", "--network", "--workdir"):
        if args[i] == "--bind":
            host, inside = args[i + 1].split(":")[:2]
            binds[inside] = host
        i += 2
    else:
        i += 1
root = open(args[i]).read().strip()
def host(text):
    for inside, real in binds.items():
        text = text.replace(inside, real)
    return text.replace("/testbed", root + "/testbed")
sys.exit(subprocess.run([host(a) for a in args[i + 1:]]).returncode)
"""


def test_with_singularity_and_no_local_copy_the_repository_comes_out_of_the_official_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.init.swe_repo import git, materialize
    from workers.sandbox.images import ImageCache

    row = django_row(tmp_path / "image-root" / "testbed")  # the image's /testbed: the repo, .git and all
    fake = tmp_path / "apptainer"
    fake.write_text(FAKE_APPTAINER)
    fake.chmod(0o755)
    monkeypatch.setenv("ROLLOUTS_SANDBOX_BACKEND", "singularity")
    monkeypatch.setenv("ROLLOUTS_SINGULARITY_EXECUTABLE", str(fake))
    monkeypatch.setenv("ROLLOUTS_STATE_DIR", str(tmp_path / "state"))
    get_settings.cache_clear()
    try:
        cache = ImageCache(get_settings().image_cache)
        instance = SweInstance.from_task(row)
        cache.cache_dir.mkdir(parents=True)
        (cache.cache_dir / cache.cached_name(instance.official_image)).write_text(str(tmp_path / "image-root"))
        get_kind("swe").validate(_task(row))  # no repo_path, no mirror: the image has it
        out = tmp_path / "out"
        materialize(instance, out)
        assert (out / "tests" / "runtests.py").is_file() and "a - b" in (out / "calc" / "__init__.py").read_text()
        assert git(out, "rev-list", "--all", "--count").decode().strip() == "1"  # the image's history stays there
    finally:
        monkeypatch.delenv("ROLLOUTS_SANDBOX_BACKEND")
        get_settings.cache_clear()
