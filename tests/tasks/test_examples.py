"""The shipped task sets are real: every task validates, and every reference answer, solution and
patch earns full reward from its kind's own evaluator (so a 0 in a run means the agent, not the data)."""

from __future__ import annotations

import pytest

from shared.kinds.stem import choices_of
from shared.tasks import get_kind, load_task_modules

from .conftest import MakeCtx, example_rows, rollout

load_task_modules()

ALL = {name: example_rows(name) for name in ("math.jsonl", "stem.jsonl", "code.jsonl", "swe.jsonl", "mixed.jsonl")}


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_example_validates(name: str) -> None:
    for row in ALL[name]:
        task = row["task"]
        get_kind(task["kind"]).validate(task)
        messages = get_kind(task["kind"]).messages(task)
        assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"].strip()


def test_mixed_batch_covers_every_kind_with_shipped_tasks() -> None:
    shipped = [row["task"] for name in ("math.jsonl", "stem.jsonl", "code.jsonl", "swe.jsonl") for row in ALL[name]]
    mixed = [row["task"] for row in ALL["mixed.jsonl"]]
    assert {task["kind"] for task in mixed} == {"math", "stem", "code", "swe"}
    assert all(task in shipped for task in mixed)


def test_math_references_grade_as_right(make_ctx: MakeCtx) -> None:
    for row in ALL["math.jsonl"]:
        task = row["task"]
        result = get_kind("math").evaluate(make_ctx(task, outputs=rollout("", f"\\boxed{{{task['answer']}}}")))
        assert result["reward"] == 1.0, (task["id"], result)


def test_stem_references_grade_as_right(make_ctx: MakeCtx) -> None:
    for row in ALL["stem.jsonl"]:
        task = row["task"]
        if choices_of(task):
            answer = f"The answer is ({task['answer']})."
        else:
            answer = f"\\boxed{{{task['answer']} {task.get('unit', '')}}}"
        result = get_kind("stem").evaluate(make_ctx(task, outputs=rollout(answer)))
        assert result["reward"] == 1.0, (task["id"], result)


@pytest.mark.usefixtures("require_bwrap")
def test_code_reference_solutions_pass_their_hidden_tests(make_ctx: MakeCtx) -> None:
    for row in ALL["code.jsonl"]:
        task = row["task"]
        result = get_kind("code").evaluate(make_ctx(task, outputs=rollout(solution=task["reference_solution"])))
        assert result["reward"] == 1.0, (task["id"], [t for t in result["tests"] if not t["passed"]])


@pytest.mark.usefixtures("require_bwrap")
def test_swe_reference_patches_resolve(make_ctx: MakeCtx) -> None:
    for row in ALL["swe.jsonl"]:
        task = row["task"]
        result = get_kind("swe").evaluate(make_ctx(task, outputs=rollout(diff=task["patch"])))
        assert result["resolved"] is True, (task["instance_id"], result)
