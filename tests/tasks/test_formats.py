"""Published dataset rows taken as they are: detection, reference extraction, refusals that name the field,
and rows read from JSONL and (through `datasets`, no hub) parquet files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.loaders import load_rows
from cli.tracking import read_row_jobs
from shared.kinds.formats import (
    FormatError,
    code_fields,
    detect,
    gsm8k_final,
    math_reference,
    row_to_task,
)
from shared.tasks import TaskValidationError, get_kind, load_task_modules
from tests.support.published_rows import (
    DEEPSCALER,
    GSM8K,
    HUMANEVAL,
    MATH,
    MBPP,
    NUMINA,
)
from workers.eval.answer_grading import grade_math
from workers.eval.answers import math_answer

load_task_modules()
SWE = {"instance_id": "a__b-1", "repo": "a/b", "base_commit": "0" * 40, "FAIL_TO_PASS": "[]", "patch": ""}


@pytest.mark.parametrize(
    ("row", "fmt", "kind"),
    [
        (GSM8K, "gsm8k", "math"),
        (MATH, "math", "math"),
        (NUMINA, "answer", "math"),
        (DEEPSCALER, "answer", "math"),
        (MBPP, "mbpp", "code"),
        (HUMANEVAL, "humaneval", "code"),
        (SWE, "swebench", "swe"),
        ({"question": "2+2?", "answer": 4}, "answer", "math"),
    ],
)
def test_detection(row: dict, fmt: str, kind: str) -> None:
    assert detect(row) == fmt
    if fmt != "swebench":
        task = row_to_task(row)
        assert (task["kind"], task["format"]) == (kind, fmt)
        get_kind(kind).validate(task)


def test_a_row_of_no_format_says_what_each_needs() -> None:
    with pytest.raises(FormatError) as caught:
        detect({"title": "x", "body": "y"})
    message = str(caught.value)
    assert "its fields: body, title" in message and "gsm8k: question, answer ending in" in message
    assert "humaneval: prompt, canonical_solution, test, entry_point" in message


def test_references_are_extracted() -> None:
    assert gsm8k_final("a\n#### 1,234,567") == "1234567" and gsm8k_final("no marker") is None
    nested = {
        "format": "math",
        "solution": "so $\\boxed{\\frac{\\sqrt{2}}{2}}$, not \\boxed{1}? No: \\boxed{\\{1, 2\\}}",
    }
    assert math_reference(nested) == "\\{1, 2\\}"
    assert math_reference({"format": "math", "solution": "$\\boxed{\\frac{a}{b^{2}}}$."}) == "\\frac{a}{b^{2}}"
    assert math_reference({"answer": 0.5}) == "0.5"


@pytest.mark.parametrize(
    ("row", "fmt", "field"),
    [
        ({"question": "q", "answer": "12"}, "gsm8k", "task.answer"),
        ({"answer": "x #### 1"}, "gsm8k", "task.question"),
        ({"problem": "p", "solution": "no box"}, "math", "task.solution"),
        ({"problem": "p"}, "answer", "task.answer"),
        ({**NUMINA, "answer": "proof"}, "answer", "task.answer"),  # NuminaMath's "nothing to check"
        ({**NUMINA, "answer": "notfound"}, "answer", "task.answer"),
        ({**MBPP, "test_list": []}, "mbpp", "task.test_list"),
        ({k: v for k, v in MBPP.items() if k != "code"}, "mbpp", "task.code"),
        ({**HUMANEVAL, "entry_point": "not a name"}, "humaneval", "task.entry_point"),
        ({k: v for k, v in HUMANEVAL.items() if k != "test"}, "humaneval", "task.test"),
    ],
)
def test_a_named_format_missing_a_field_is_refused(row: dict, fmt: str, field: str) -> None:
    with pytest.raises(FormatError, match=field):
        row_to_task(row, fmt)
    with pytest.raises(TaskValidationError, match=field):  # the API's check: the same message, a 422
        task = {**row, "format": fmt, "kind": "code" if fmt in ("mbpp", "humaneval") else "math"}
        get_kind(task["kind"]).validate(task)


def test_format_and_kind_must_agree() -> None:
    with pytest.raises(TaskValidationError, match=r"task\.format"):
        get_kind("code").validate({"kind": "code", "format": "gsm8k", **GSM8K})


def test_code_rows_become_the_code_kinds_fields() -> None:
    human = code_fields({**HUMANEVAL, "format": "humaneval"})
    assert human["starter_code"] == HUMANEVAL["prompt"] and "format" not in human
    assert human["tests"][0]["code"].endswith("check(has_close_elements)\n")
    assert human["reference_solution"] == HUMANEVAL["prompt"] + HUMANEVAL["canonical_solution"]
    assert code_fields(human) == human  # reading it again changes nothing
    mbpp = code_fields({**MBPP, "format": "mbpp", "test_setup_code": "import math", "test_imports": ["import os"]})
    assert [t["name"] for t in mbpp["tests"]] == ["test_list[0]", "test_list[1]"]
    assert mbpp["tests"][0]["code"].startswith("import os\nimport math\nassert set(")
    assert MBPP["test_list"][0] in mbpp["prompt"] and mbpp["reference_solution"] == MBPP["code"]


def test_gsm8k_style_answers_of_a_model_are_read() -> None:
    assert math_answer("so\n#### 1,000.", None).text == "1000"
    assert math_answer("", "#### 72").source == "finish.marker"
    graded = grade_math("Natalia sold 72.\n#### 72", None, "72")
    assert graded["reward"] == 1.0 and graded["source"] == "final_text.marker"


def test_rows_from_jsonl_and_parquet_with_row_numbers(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    import datasets

    rows = [GSM8K, MATH, NUMINA]
    parquet = tmp_path / "train.parquet"
    columns = sorted({name for row in rows for name in row})
    datasets.Dataset.from_dict({c: [row.get(c) for row in rows] for c in columns}).to_parquet(str(parquet))
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {"kind": "math", "problem": "1", "answer": 1}]))
    from_parquet = load_rows(parquet)
    assert from_parquet[0] == GSM8K and from_parquet[1] == MATH  # a column a row lacks is not a None field
    jobs = read_row_jobs(parquet, None)
    assert [j["task"]["format"] for j in jobs] == ["gsm8k", "math", "answer"]
    assert read_row_jobs(jsonl, None)[3] == {"task": {"kind": "math", "problem": "1", "answer": 1}}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GSM8K) + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 2: matches no known format"):
        read_row_jobs(bad, None)
    with pytest.raises(ValueError, match=r"row 1: task\.solution"):
        read_row_jobs(jsonl, "math")


def test_every_shipped_example_reference_is_given_as_a_rollout_would_give_it() -> None:
    """The given output of each example row is what its evaluator reads (judged in test_validate)."""
    root = Path(__file__).resolve().parents[2] / "examples"
    for name, field in (("math.jsonl", "answer"), ("stem.jsonl", "answer"), ("code.jsonl", "extra")):
        for line in (root / name).read_text().splitlines():
            task = json.loads(line)["task"]
            given = get_kind(task["kind"]).given_rollout(task, None)
            assert given[field], (name, task)
    with pytest.raises(TaskValidationError, match="given: kind 'demo' cannot"):
        get_kind("demo").given_rollout({"kind": "demo"}, None)
