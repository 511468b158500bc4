"""SWE instances: the repository at base_commit, the agent's diff judged on a fresh copy with the
task's tests restored (editing or deleting tests earns nothing), SWE-bench style resolution."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shared.kinds.swe_instance import SweInstance
from shared.tasks import TaskValidationError, get_kind, load_task_modules
from workers.init.swe_repo import materialize
from workers.sandbox import create_sandbox

from .conftest import EXAMPLES, MakeCtx, example_rows, rollout

load_task_modules()
pytestmark = pytest.mark.usefixtures("require_bwrap")

TASK = example_rows("swe.jsonl")[0]["task"]  # slugkit: slugify keeps repeated and edge dashes
FIX = ('"[^a-z0-9]", "-", text).replace("--", "-")', '"[^a-z0-9]+", "-", text).strip("-")')
CHEAT_TESTS = "def test_collapses_separators():\n    pass\n\n\ndef test_strips_edges():\n    pass\n"


def _rollout(make_ctx: MakeCtx, short_dir: Path, edits: list[tuple[str, dict]]) -> dict:
    """init, then the given tool calls in a real sandbox over the workspace, then collect."""
    kind = get_kind("swe")
    ctx = make_ctx(TASK, stage="init")
    init = kind.init(ctx)
    assert init["commit"] == TASK["base_commit"]
    box = create_sandbox(kind.sandbox_spec(TASK, ctx.settings), ctx.workspace, short_dir / "rt", ctx.settings)
    with box:
        for tool, args in edits:
            result = box.call(tool, args)
            assert not result.is_error, result.output
        return kind.collect(ctx, box)


def _evaluate(make_ctx: MakeCtx, extra: dict) -> dict:
    return get_kind("swe").evaluate(make_ctx(TASK, outputs=rollout(**extra)))


def test_agent_fix_resolves(make_ctx: MakeCtx, short_dir: Path) -> None:
    extra = _rollout(
        make_ctx,
        short_dir,
        [
            ("bash", {"command": "git status --short && python -m pytest -q tests >/dev/null; true"}),
            ("str_replace", {"path": "slugkit/core.py", "old_str": FIX[0], "new_str": FIX[1]}),
        ],
    )
    assert "slugkit/core.py" in extra["diff"] and ".pytest_cache" not in extra["diff"]
    result = _evaluate(make_ctx, extra)
    assert result["reward"] == 1.0 and result["resolved"] is True
    assert set(result["FAIL_TO_PASS"].values()) == {"passed"} and set(result["PASS_TO_PASS"].values()) == {"passed"}


def test_editing_the_tests_earns_nothing(make_ctx: MakeCtx, short_dir: Path) -> None:
    extra = _rollout(make_ctx, short_dir, [("create", {"path": "tests/test_core.py", "file_text": CHEAT_TESTS})])
    result = _evaluate(make_ctx, extra)
    assert result["reward"] == 0.0 and result["patch_applied"] is True
    assert result["restored_test_files"] == ["tests/test_core.py"]
    assert set(result["FAIL_TO_PASS"].values()) == {"failed"}
    assert set(result["PASS_TO_PASS"].values()) == {"passed"}  # the original tests are back


def test_a_conftest_that_drops_tests_is_removed(make_ctx: MakeCtx, short_dir: Path) -> None:
    hook = "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n    items.clear()\n"
    extra = _rollout(make_ctx, short_dir, [("create", {"path": "conftest.py", "file_text": hook})])
    result = _evaluate(make_ctx, extra)
    assert "conftest.py" in result["restored_test_files"] and result["reward"] == 0.0
    assert set(result["PASS_TO_PASS"].values()) == {"passed"}


def test_deleting_the_tests_earns_nothing(make_ctx: MakeCtx, short_dir: Path) -> None:
    extra = _rollout(make_ctx, short_dir, [("bash", {"command": "git rm -q -r tests"})])
    result = _evaluate(make_ctx, extra)
    assert result["reward"] == 0.0 and set(result["PASS_TO_PASS"].values()) == {"passed"}


def test_reference_patch_resolves_and_empty_diff_does_not(make_ctx: MakeCtx) -> None:
    reference = _evaluate(make_ctx, {"diff": TASK["patch"]})
    assert reference["reward"] == 1.0, str(reference)
    for nothing in ("", b"", "\n"):  # as SWE-bench's harness: unresolved, no test run (no sandbox, no pytest)
        empty = _evaluate(make_ctx, {"diff": nothing})
        assert empty["reward"] == 0.0 and empty["empty_patch"] is True and "FAIL_TO_PASS" not in empty, empty


def test_bad_diffs(make_ctx: MakeCtx) -> None:
    garbage = _evaluate(make_ctx, {"diff": "diff --git a/x b/x\nnot a patch\n"})
    assert garbage["reward"] == 0.0 and garbage["patch_applied"] is False and "does not apply" in garbage["error"]
    git_dir = "diff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-a\n+b\n"
    assert "touches .git" in _evaluate(make_ctx, {"diff": git_dir})["error"]
    missing = _evaluate(make_ctx, {"diff": None, "diff_error": "the diff is too large"})
    assert missing["reward"] == 0.0 and missing["error"] == "the diff is too large"


def test_edited_source_files_no_longer_match_base_commit(tmp_path: Path) -> None:
    source = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "swe" / "repos" / "slugkit", source)
    (source / "README.md").write_text("changed\n")
    instance = SweInstance.from_task({**TASK, "repo_path": str(source)})
    with pytest.raises(RuntimeError, match="not base_commit"):
        materialize(instance, tmp_path / "out")


def test_git_repository_source_is_exported_without_history(tmp_path: Path) -> None:
    source = tmp_path / "upstream"
    shutil.copytree(EXAMPLES / "swe" / "repos" / "slugkit", source)
    from workers.init.swe_repo import git, snapshot_commit

    first = snapshot_commit(source)
    (source / "slugkit" / "core.py").write_text("# the fix, committed later\n")
    git(source, "commit", "-q", "-am", "fix")
    instance = SweInstance.from_task({**TASK, "repo_path": str(source), "base_commit": first})
    out = tmp_path / "out"
    materialize(instance, out)
    assert "replace" in (out / "slugkit" / "core.py").read_text()
    assert git(out, "rev-list", "--all", "--count").decode().strip() == "1"


def test_swe_bench_style_fields_and_aliases(task_settings) -> None:
    row = {
        "instance_id": "owner__name-1",
        "repo_name": "owner/name",
        "commit_hash": "abc1234",
        "problem_statement": "it breaks",
        "FAIL_TO_PASS": '["tests/test_a.py::test_x"]',
        "PASS_TO_PASS": "[]",
        "docker_image": "docker://example/img",
    }
    instance = SweInstance.from_task(row)
    assert (instance.repo, instance.base_commit, instance.image) == ("owner/name", "abc1234", "docker://example/img")
    assert instance.fail_to_pass == ("tests/test_a.py::test_x",) and instance.pass_to_pass == ()
    assert get_kind("swe").sandbox_spec(row, task_settings).image == "docker://example/img"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"instance_id": None}, "task.instance_id"),
        ({"base_commit": None}, "task.base_commit"),
        ({"base_commit": "--output=/tmp/x"}, "task.base_commit"),  # reaches git on the host: never an option
        ({"repo": "/srv/elsewhere"}, "task.repo"),  # never a path outside the mirror
        ({"repo": "owner/../../etc"}, "task.repo"),
        ({"FAIL_TO_PASS": []}, "task.FAIL_TO_PASS"),
        ({"PASS_TO_PASS": "not json"}, "task.PASS_TO_PASS"),
        ({"test_timeout_s": 0}, "task.test_timeout_s"),
    ],
)
def test_validation_names_the_field(change: dict, field: str) -> None:
    task = {k: v for k, v in {**TASK, **change}.items() if v is not None}
    with pytest.raises(TaskValidationError, match=field):
        get_kind("swe").validate(task)


def test_junit_report_node_ids_and_outcomes(tmp_path: Path) -> None:
    """Per-test outcomes read back from a real pytest run's xunit1 report, keyed by node id."""
    import subprocess
    import sys

    from workers.eval.swe_resolve import parse_junit

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mix.py").write_text(
        "import pytest\n\n\n"
        "class TestGroup:\n    def test_in_class(self):\n        pass\n\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\ndef test_param(n):\n    assert n == 1\n\n\n"
        "@pytest.mark.xfail\ndef test_expected_failure():\n    assert False\n\n\n"
        "@pytest.mark.skip\ndef test_skipped():\n    pass\n\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError\n\n\n"
        "def test_setup_error(broken):\n    pass\n"
    )
    report = tmp_path / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--rootdir=.",
            "-p",
            "no:cacheprovider",
            "-o",
            "junit_family=xunit1",
            f"--junitxml={report}",
            "-q",
            "tests/test_mix.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    assert parse_junit(report) == {
        "tests/test_mix.py::TestGroup::test_in_class": "passed",
        "tests/test_mix.py::test_param[1]": "passed",
        "tests/test_mix.py::test_param[2]": "failed",
        "tests/test_mix.py::test_expected_failure": "xfailed",
        "tests/test_mix.py::test_skipped": "skipped",
        "tests/test_mix.py::test_setup_error": "error",
    }
    assert parse_junit(tmp_path / "missing.xml") == {}


# --- faking the test run ---------------------------------------------------------------------------

FAKE_PYTEST = (
    "import sys\n"
    "report = [a.split('=', 1)[1] for a in sys.argv if a.startswith('--junitxml=')][0]\n"
    "names = ['test_collapses_separators', 'test_strips_edges', 'test_simple_word', 'test_lowercases']\n"
    "cases = ''.join(\n"
    '    \'<testcase file="tests/test_core.py" classname="tests.test_core" name="%s"/>\' % n for n in names\n'
    ")\n"
    "with open(report, 'w') as handle:\n"
    "    handle.write('<testsuite>%s</testsuite>' % cases)\n"
)


@pytest.mark.parametrize("path", ["pytest.py", "_pytest/__init__.py", "sitecustomize.py"])
def test_a_diff_that_shadows_pytest_does_not_resolve(make_ctx: MakeCtx, short_dir: Path, path: str) -> None:
    extra = _rollout(make_ctx, short_dir, [("create", {"path": path, "file_text": FAKE_PYTEST})])
    result = _evaluate(make_ctx, extra)
    assert result["reward"] == 0.0 and result["resolved"] is False
    assert path in result["restored_test_files"]
    assert set(result["FAIL_TO_PASS"].values()) == {"failed"}


def test_xfail_in_the_agents_source_is_not_a_pass(make_ctx: MakeCtx, short_dir: Path) -> None:
    """pytest.xfail() in slugify turns every failing test into an xfail: that resolves nothing."""
    xfail = ("    text = text.lower()\n", "    text = text.lower()\n    import pytest\n\n    pytest.xfail('later')\n")
    extra = _rollout(
        make_ctx, short_dir, [("str_replace", {"path": "slugkit/core.py", "old_str": xfail[0], "new_str": xfail[1]})]
    )
    result = _evaluate(make_ctx, extra)
    assert set(result["FAIL_TO_PASS"].values()) == {"xfailed"}
    assert result["reward"] == 0.0 and result["resolved"] is False


def test_files_named_by_node_ids_are_restored(make_ctx: MakeCtx, tmp_path: Path) -> None:
    """A test file outside the test-path pattern and the test patch is judged as it is at the base."""
    from workers.init.swe_repo import snapshot_commit

    source = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "swe" / "repos" / "slugkit", source)
    check = "from slugkit.core import slugify\n\n\ndef test_selfcheck():\n    assert slugify('a - b') == 'a-b'\n"
    (source / "slugkit" / "selfcheck.py").write_text(check)
    task = {
        **TASK,
        "repo_path": str(source),
        "base_commit": snapshot_commit(source),
        "FAIL_TO_PASS": ["slugkit/selfcheck.py::test_selfcheck"],
    }
    weakened = (
        "diff --git a/slugkit/selfcheck.py b/slugkit/selfcheck.py\n--- a/slugkit/selfcheck.py\n"
        "+++ b/slugkit/selfcheck.py\n@@ -4,2 +4,2 @@\n def test_selfcheck():\n"
        "-    assert slugify('a - b') == 'a-b'\n+    assert True\n"
    )
    get_kind("swe").validate(task)
    result = get_kind("swe").evaluate(make_ctx(task, outputs=rollout(diff=weakened)))
    assert result["patch_applied"] is True and "slugkit/selfcheck.py" in result["restored_test_files"]
    assert result["FAIL_TO_PASS"] == {"slugkit/selfcheck.py::test_selfcheck": "failed"}
    assert result["reward"] == 0.0


def test_shadowing_paths() -> None:
    from workers.eval.swe_resolve import shadows_tooling

    for path in ("pytest.py", "src/py.py", "_pytest/main.py", "pytest/__init__.py", "a/b/x.pth", "sitecustomize.py"):
        assert shadows_tooling(path), path
    for path in ("slugkit/core.py", "pytest_plugin_docs.md", "mypy.py"):
        assert not shadows_tooling(path), path


def test_a_change_in_another_encoding_keeps_its_exact_bytes(make_ctx: MakeCtx, short_dir: Path) -> None:
    import base64

    extra = _rollout(
        make_ctx,
        short_dir,
        [
            ("str_replace", {"path": "slugkit/core.py", "old_str": FIX[0], "new_str": FIX[1]}),
            ("bash", {"command": "printf '# caf\\351\\n' >> slugkit/core.py"}),  # latin-1, not UTF-8
        ],
    )
    assert extra["diff"] is None and "diff_error" not in extra
    assert b"+# caf\xe9\n" in base64.b64decode(extra["diff_b64"])
    result = _evaluate(make_ctx, extra)
    assert result["patch_applied"] is True and result["reward"] == 1.0


def test_a_huge_new_file_is_refused_before_the_diff_is_built(make_ctx: MakeCtx, short_dir: Path) -> None:
    extra = _rollout(make_ctx, short_dir, [("bash", {"command": "head -c 3000000 /dev/zero > blob.bin"})])
    assert extra["diff"] is None and "add or remove over" in extra["diff_error"]


ALONE = "def test_alone(request):\n    assert not request.config.pluginmanager.has_plugin('anyio')\n"


def test_the_services_own_pytest_plugins_stay_out_of_the_repository(
    make_ctx: MakeCtx, task_settings, short_dir: Path
) -> None:
    """With this service's interpreter, pytest loads none of the plugins installed beside it (anyio's comes
    with FastAPI), in the eval's run and in the agent's `python -m pytest`: they are no part of the
    repository, and their loading cost ~3 s of CPU per pytest start here."""
    from workers.eval.fresh_sandbox import fresh_sandbox, sandbox_python
    from workers.eval.swe_resolve import run_pytest
    from workers.sandbox import SandboxSpec

    python = sandbox_python(task_settings)
    with fresh_sandbox(
        SandboxSpec(),
        task_settings,
        python,
        lambda: None,
        lambda: 120.0,
        lambda ws: (ws / "test_alone.py").write_text(ALONE),
        needs=("pytest",),
    ) as box:
        outcomes, info = run_pytest(box, ["test_alone.py::test_alone"], python, 120.0)
    assert outcomes == {"test_alone.py::test_alone": "passed"}, info

    ctx = make_ctx(TASK, stage="rollout")
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    (ctx.workspace / "test_alone.py").write_text(ALONE)
    spec = get_kind("swe").sandbox_spec(TASK, ctx.settings)
    with create_sandbox(spec, ctx.workspace, short_dir / "rt", ctx.settings) as box:
        result = box.call("bash", {"command": "python -m pytest -q -p no:cacheprovider test_alone.py"})
    assert "1 passed" in result.output, result.output


def test_a_rollout_that_called_no_tool_is_collected_without_a_sandbox(make_ctx: MakeCtx) -> None:
    """Nothing ran in the workspace of a job whose on-demand sandbox no tool opened: collect starts none (the
    test-cache cleanup cost a bwrap start per job, queued at the start cap) and builds no second copy of the
    base to diff against (~1 s a job in a burst): the diff is empty."""
    from workers.rollout.job_sandbox import OnDemandSandbox

    def never() -> None:
        raise AssertionError("collect started a sandbox for a rollout that called no tool")

    kind = get_kind("swe")
    ctx = make_ctx(TASK, stage="init")
    kind.init(ctx)
    extra = kind.collect(ctx, OnDemandSandbox(never, never))
    assert extra == {"diff": ""}
