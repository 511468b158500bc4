"""Code tasks: hidden tests in a fresh sandbox; loops and memory hogs fail their tests, not the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.tasks import StageInterrupted, TaskValidationError, get_kind, load_task_modules
from workers.sandbox import SandboxError, SandboxSpec, create_sandbox

from .conftest import MakeCtx, rollout

load_task_modules()
pytestmark = pytest.mark.usefixtures("require_bwrap")

TASK = {
    "kind": "code",
    "prompt": "Write add(a, b); as a program, read two integers and print their sum.",
    "tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"code": "assert add(2, 2) == 4"}],
    "test_code": (
        "from solution import add\n\n\n"
        "def test_zero():\n    assert add(0, 0) == 0\n\n\n"
        "def test_negative():\n    assert add(-1, -1) == -2\n"
    ),
    "timeout_s": 3,
    "memory_mb": 256,
}
RIGHT = (
    "import sys\n\n\ndef add(a, b):\n    return a + b\n\n\n"
    "if __name__ == '__main__':\n    a, b = map(int, sys.stdin.read().split())\n    print(add(a, b))\n"
)


def _evaluate(make_ctx: MakeCtx, solution: str | None, **task_changes: object) -> dict:
    task = {**TASK, **task_changes}
    get_kind("code").validate(task)
    return get_kind("code").evaluate(make_ctx(task, outputs=rollout(solution=solution)))


def test_right_solution_passes_everything(make_ctx: MakeCtx) -> None:
    result = _evaluate(make_ctx, RIGHT)
    assert result["reward"] == 1.0 and result["passed"] == result["total"] == 4
    assert [t["name"] for t in result["tests"]] == ["test_0", "test_1", "test_zero", "test_negative"]


def test_fraction_and_all_or_nothing(make_ctx: MakeCtx) -> None:
    partly = RIGHT.replace("return a + b", "return a + b if a >= 0 else 0")
    fraction = _evaluate(make_ctx, partly)
    assert fraction["reward"] == 0.75
    failed = [t for t in fraction["tests"] if not t["passed"]]
    assert [t["name"] for t in failed] == ["test_negative"] and failed[0]["status"] == "failed"
    assert "AssertionError" in failed[0]["detail"]
    assert _evaluate(make_ctx, partly, scoring="all")["reward"] == 0.0


def test_infinite_loop_times_out_each_test(make_ctx: MakeCtx) -> None:
    looping = "def add(a, b):\n    while True:\n        pass\n\n\nif __name__ == '__main__':\n    add(1, 2)\n"
    result = _evaluate(make_ctx, looping, timeout_s=1)
    assert result["reward"] == 0.0
    assert {t["status"] for t in result["tests"]} == {"timeout"}


def test_memory_hog_is_stopped_by_the_limit(make_ctx: MakeCtx) -> None:
    hog = (
        "def add(a, b):\n    blocks = []\n    while True:\n        blocks.append(bytearray(50 * 1024 * 1024))\n\n\n"
        "if __name__ == '__main__':\n    add(1, 2)\n"
    )
    result = _evaluate(make_ctx, hog, memory_mb=128)
    assert result["reward"] == 0.0
    assert all(t["status"] == "error" and "MemoryError" in t["detail"] for t in result["tests"])


def test_exiting_early_with_status_zero_does_not_pass(make_ctx: MakeCtx) -> None:
    result = _evaluate(make_ctx, "import os\nos._exit(0)\n")
    assert result["reward"] == 0.0 and result["passed"] == 0


def test_wrong_output_and_crash(make_ctx: MakeCtx) -> None:
    result = _evaluate(make_ctx, "print(4)\n")
    statuses = {t["name"]: t["status"] for t in result["tests"]}
    assert statuses["test_0"] == "wrong_output" and statuses["test_1"] == "error"


def test_no_solution_file_is_reward_zero_with_a_reason(make_ctx: MakeCtx) -> None:
    result = _evaluate(make_ctx, None)
    assert result["reward"] == 0.0 and "solution.py" in result["error"]


def test_a_sandbox_that_cannot_run_is_an_error_not_a_zero(make_ctx: MakeCtx) -> None:
    with pytest.raises(SandboxError, match="eval sandbox cannot run"):
        _evaluate(make_ctx, RIGHT, python="/nonexistent/python3")


def test_an_eval_that_overruns_its_stage_is_interrupted(make_ctx: MakeCtx) -> None:
    looping = "def add(a, b):\n    while True:\n        pass\n"
    task = {**TASK, "timeout_s": 60}
    ctx = make_ctx(task, outputs=rollout(solution=looping), seconds=3)
    with pytest.raises(StageInterrupted) as stopped:
        get_kind("code").evaluate(ctx)
    assert stopped.value.reason == "timed_out"


def test_collect_reads_the_solution_and_refuses_escapes(make_ctx: MakeCtx, short_dir: Path) -> None:
    kind = get_kind("code")
    ctx = make_ctx({**TASK, "starter_code": "# write add here\n"}, stage="init")
    assert kind.init(ctx) == {"files": ["solution.py"]}
    box = create_sandbox(SandboxSpec(), ctx.workspace, short_dir / "rt", ctx.settings)
    with box:
        box.call("create", {"path": "solution.py", "file_text": RIGHT})
        assert kind.collect(ctx, box) == {"solution": RIGHT}
        box.call("bash", {"command": "rm solution.py && ln -s /etc/hostname solution.py"})
        escaped = kind.collect(ctx, box)
    assert escaped["solution"] is None and "outside the workspace" in escaped["solution_error"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"prompt": ""}, "task.prompt"),
        ({"tests": [{"stdin": "1"}], "test_code": None}, "task.tests"),
        ({"tests": [], "test_code": None}, "at least one test"),
        ({"test_code": "def test_x(:\n"}, "task.test_code"),
        ({"scoring": "most"}, "task.scoring"),
        ({"entry_file": "../escape.py"}, "task.entry_file"),
        ({"timeout_s": 0}, "task.timeout_s"),
    ],
)
def test_validation_names_the_field(change: dict, field: str) -> None:
    task = {k: v for k, v in {**TASK, **change}.items() if v is not None}
    with pytest.raises(TaskValidationError, match=field):
        get_kind("code").validate(task)


# --- forging the harness's verdict -------------------------------------------------------------

ASSERT_ONLY = {
    "tests": [{"code": "assert add(2, 2) == 5"}],
    "test_code": "from solution import add\n\n\ndef test_x():\n    assert add(1, 1) == 3\n",
}

# Each prints "<token> PASS" as the last line and exits 0 from wherever it finds the token.
FORGE_FROM_MAIN = (
    "import __main__, os, sys\n"
    "sys.stdout.write('\\n%s PASS\\n' % getattr(__main__, 'token', 'none'))\n"
    "sys.stdout.flush()\n"
    "os._exit(0)\n"
)
FORGE_FROM_ENVIRON = (
    "import os, sys\n"
    "found = ''\n"
    "for path in ('/proc/self/environ', '/proc/%d/environ' % os.getppid()):\n"
    "    try:\n"
    "        for item in open(path, 'rb').read().split(b'\\0'):\n"
    "            if item.startswith(b'ROLLOUTS_EVAL_TOKEN='):\n"
    "                found = item.split(b'=', 1)[1].decode()\n"
    "    except OSError:\n"
    "        pass\n"
    "for fd_path in ('/proc/self/fd/3', '.eval/token'):\n"
    "    try:\n"
    "        found = found or open(fd_path).read().strip()\n"
    "    except OSError:\n"
    "        pass\n"
    "sys.stdout.write('\\n%s PASS\\n' % found)\n"
    "sys.stdout.flush()\n"
    "os._exit(0)\n"
)


@pytest.mark.parametrize("forgery", [FORGE_FROM_MAIN, FORGE_FROM_ENVIRON], ids=["main_token", "environ"])
def test_a_solution_cannot_print_the_pass_token(make_ctx: MakeCtx, forgery: str) -> None:
    result = _evaluate(make_ctx, forgery, **ASSERT_ONLY)
    assert result["passed"] == 0 and result["reward"] == 0.0, result


def test_a_test_run_cannot_rewrite_the_hidden_tests_for_later_tests(make_ctx: MakeCtx) -> None:
    """Test 1 imports the solution, which rewrites .eval (tests, harness) and drops shadowing modules."""
    rewrite = (
        "import os\n"
        "PASSING = 'def test_a():\\n    pass\\n\\n\\ndef test_b():\\n    pass\\n\\n\\ndef test_c():\\n    pass\\n'\n"
        "for path in ('.eval/_hidden_tests.py', '_hidden_tests.py'):\n"
        "    try:\n"
        "        with open(path, 'w') as handle:\n"
        "            handle.write(PASSING)\n"
        "    except OSError:\n"
        "        pass\n"
        "for name in os.listdir('.eval'):\n"
        "    if name.startswith('case_') and name.endswith('.py'):\n"
        "        with open(os.path.join('.eval', name), 'w') as handle:\n"
        "            handle.write('pass\\n')\n"
        "\n\ndef add(a, b):\n    return a - b\n"
    )
    test_code = (
        "from solution import add\n\n\n"
        "def test_a():\n    assert add(1, 1) == 2\n\n\n"
        "def test_b():\n    assert add(2, 2) == 4\n\n\n"
        "def test_c():\n    assert add(3, 3) == 6\n"
    )
    result = _evaluate(make_ctx, rewrite, tests=[{"code": "assert add(1, 2) == 3"}], test_code=test_code)
    assert result["passed"] == 0, result["tests"]
