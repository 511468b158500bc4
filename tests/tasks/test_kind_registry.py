"""The registry's two halves: a kind's spec is loaded at start-up (the API needs nothing more), its stage
code only when a worker asks for it; a spec that names no stage code, or names a class that is not
its stage code, is refused with a message that says so; a kind written as one class still works."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from shared.kinds.agentic import TOOL_PARSERS
from shared.tasks import TaskKind, TaskSpec, get_kind, get_spec, load_task_modules, register, registry, validate_job
from shared.tasks.base import TaskValidationError
from workers.rollout.tool_parsers import known_parsers

SPLIT = "tests.support.split_kind"


@pytest.fixture(autouse=True)
def own_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The kinds these tests register stay in these tests."""
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    yield


def _modules_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after `code` (nothing of this test process leaks in)."""
    script = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    return done.stdout.split()


def test_loading_the_specs_loads_no_stage_code() -> None:
    loaded = _modules_after(
        f"from shared.tasks import load_task_modules, validate_job\n"
        f"load_task_modules(['{SPLIT}'])\n"
        f"validate_job({{'task': {{'kind': 'split_echo', 'text': 'hi'}}}})\n"
        f"validate_job({{'task': {{'kind': 'code', 'prompt': 'p', 'tests': [{{'code': 'assert 1'}}]}}}})"
    )
    assert "tests.support.split_kind" in loaded and "shared.kinds.code" in loaded
    assert [name for name in loaded if name.startswith(("workers", "tests.support.split_kind_stages"))] == []


def test_a_split_kind_validates_by_its_spec_and_runs_its_stage_code() -> None:
    load_task_modules([SPLIT])
    spec = get_spec("split_echo")
    assert type(spec).__name__ == "EchoSpec" and not isinstance(spec, TaskKind)
    with pytest.raises(TaskValidationError, match=r"task\.text"):
        validate_job({"task": {"kind": "split_echo"}})
    kind = get_kind("split_echo")
    assert type(kind).__name__ == "EchoKind" and isinstance(kind, type(spec))
    assert get_kind("split_echo") is kind  # imported once


def test_a_kind_in_one_class_is_its_own_stage_code() -> None:
    @register
    class OneClass(TaskKind):
        name = "one_class_kind"

    assert type(get_spec("one_class_kind")) is OneClass and get_kind("one_class_kind") is get_spec("one_class_kind")


def test_a_spec_without_stage_code_is_refused_when_registered() -> None:
    with pytest.raises(TypeError, match="names its stage code in `stages`"):

        @register
        class NoStages(TaskSpec):
            name = "no_stages_kind"


@pytest.mark.parametrize(
    ("stages", "why"),
    [
        ("tests.support.split_kind_stages:EchoSpec", "not a TaskKind subclass of"),  # the spec itself
        ("shared.kinds.demo:DemoSpec", "not a TaskKind subclass of"),
        ("workers.kinds.demo:DemoKind", "not a TaskKind subclass of"),  # another kind's stage code
        ("tests.support.split_kind_stages:Missing", "not a TaskKind subclass of"),
    ],
)
def test_stage_code_that_is_not_the_specs_own_is_refused_by_the_worker(stages: str, why: str) -> None:
    register(type("Misnamed", (TaskSpec,), {"name": "misnamed_kind", "stages": stages}))
    with pytest.raises(TypeError, match=why):
        get_kind("misnamed_kind")


def test_stage_code_under_another_name_is_refused() -> None:
    @register
    class NamedSpec(TaskSpec):
        name = "named_kind"
        stages = f"{__name__}:_RENAMED"

    class Renamed(NamedSpec, TaskKind):
        name = "renamed"

    globals()["_RENAMED"] = Renamed
    with pytest.raises(TypeError, match="is named 'renamed'"):
        get_kind("named_kind")


def test_the_specs_tool_parsers_are_the_workers_parsers() -> None:
    assert sorted(TOOL_PARSERS) == known_parsers()
