"""Task sets from JSONL and from Hugging Face datasets on disk (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.loaders import LoaderError, load_hf, load_jsonl

SWE_ROWS = [
    {
        "instance_id": f"owner__repo-{i}",
        "repo": "owner/repo",
        "base_commit": "0" * 40,
        "problem_statement": f"issue {i}",
        "test_patch": "",
        "FAIL_TO_PASS": [f"tests/test_a.py::test_{i}"],
        "PASS_TO_PASS": [],
    }
    for i in range(3)
]


def test_jsonl_jobs_bare_tasks_and_kind(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    lines = [
        {"task": {"kind": "math", "problem": "1+1", "answer": "2"}, "limits": {"max_turns": 2}},
        {"kind": "stem", "question": "q", "answer": "1"},
        {"problem": "2+2", "answer": "4"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    jobs = load_jsonl(path, kind="math")
    assert jobs[0] == lines[0]
    assert jobs[1] == {"task": lines[1]}
    assert jobs[2]["task"]["kind"] == "math"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json\n", "tasks.jsonl:1: not valid JSON"),
        ('{"x": 1}\n[1]\n', "tasks.jsonl:1: the task names no"),
        ('{"kind": "math"}\n[1]\n', "tasks.jsonl:2: a JSON object"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(content)
    with pytest.raises(LoaderError, match=message):
        load_jsonl(path)


def test_example_files_load() -> None:
    root = Path(__file__).resolve().parents[2] / "examples"
    sizes = {name: len(load_jsonl(root / name)) for name in ("math.jsonl", "code.jsonl", "stem.jsonl", "swe.jsonl")}
    assert sizes == {"math.jsonl": 20, "code.jsonl": 20, "stem.jsonl": 10, "swe.jsonl": 5}


def test_hf_save_to_disk_swe_rows(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"test": datasets.Dataset.from_list(SWE_ROWS)}).save_to_disk(str(tmp_path / "swe"))
    jobs = load_hf(
        tmp_path / "swe", "swe", defaults={"repo_path": "mirrors/{instance_id}"}, limits={"max_turns": 4}, limit=2
    )
    assert len(jobs) == 2 and jobs[0]["limits"] == {"max_turns": 4}
    task = jobs[1]["task"]
    assert task["kind"] == "swe" and task["repo_path"] == "mirrors/owner__repo-1"
    assert task["FAIL_TO_PASS"] == ["tests/test_a.py::test_1"] and isinstance(task["FAIL_TO_PASS"], list)
    from shared.kinds.swe_instance import SweInstance

    assert SweInstance.from_task(task).instance_id == "owner__repo-1"


def test_hf_parquet_with_renamed_fields(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [{"question": "1+1", "solution": "2"}, {"question": "2+3", "solution": "5"}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "math.parquet"))
    jobs = load_hf(tmp_path / "math.parquet", "math", fields={"question": "problem", "solution": "answer"})
    assert [j["task"] for j in jobs] == [
        {"kind": "math", "problem": "1+1", "answer": "2"},
        {"kind": "math", "problem": "2+3", "answer": "5"},
    ]


def test_hf_errors(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    splits = {"a": datasets.Dataset.from_list(SWE_ROWS), "b": datasets.Dataset.from_list(SWE_ROWS)}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(LoaderError, match="several splits"):
        load_hf(tmp_path / "two", "swe")
    with pytest.raises(LoaderError, match="no split 'c'"):
        load_hf(tmp_path / "two", "swe", split="c")
    assert len(load_hf(tmp_path / "two", "swe", split="b")) == 3
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(LoaderError, match="expected a save_to_disk directory"):
        load_hf(tmp_path / "notes.txt", "math")
    with pytest.raises(LoaderError, match="no such file"):
        load_hf(tmp_path / "missing", "math")
