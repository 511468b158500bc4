"""Task sets from files: JSONL job lines, and Hugging Face `datasets` data already on disk.

Both return job dicts as POST /v1/jobs takes them (`{"task": {...}, "limits": ...}`).
Nothing is downloaded: the HF loader reads a directory written by
`Dataset.save_to_disk`, or parquet / arrow / JSON(L) / CSV files, through the
`datasets` package (the optional extra `data`), imported only when used.

A row becomes a task by: renaming columns (`fields`, e.g. {"question": "problem"}),
adding `kind`, and adding `defaults`, whose string values may name row fields
(`"mirrors/{instance_id}"`). SWE-bench, SWE-Gym and R2E-Gym rows need no
renaming: the swe kind reads their columns as they are.

Rows of a published data set (GSM8K, MATH, plain-answer, MBPP, HumanEval,
SWE-bench) need no mapping at all: `load_rows` reads them from JSONL or, through
`datasets`, from parquet/arrow/CSV files or a save_to_disk directory, and
`row_job` makes each a job by its format (named, or detected;
shared/kinds/formats.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from shared.errors import RolloutsError
from shared.kinds.formats import row_to_task

_FILE_BUILDERS = {
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
}


class LoaderError(RolloutsError, ValueError):
    """A file that does not hold task rows; the message names the file (and line)."""


def load_jsonl(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Job dicts from a JSONL file; a bare task line (it has `kind`, no `task`) is wrapped as a job.

    `kind` fills in lines whose task names none.
    """
    path = Path(path)
    jobs = []
    for number, row in _jsonl_objects(path):
        job = row if "task" in row else {"task": row}
        if not isinstance(job["task"], dict):
            raise LoaderError(f"{path}:{number}: `task` must be an object")
        if kind and "kind" not in job["task"]:
            job["task"] = {"kind": kind, **job["task"]}
        if "kind" not in job["task"]:
            raise LoaderError(f"{path}:{number}: the task names no `kind`")
        jobs.append(job)
    return jobs


def _jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; LoaderError naming the line that is not a JSON object."""
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LoaderError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise LoaderError(f"{path}:{number}: a JSON object per line")
            yield number, row


def load_hf(
    path: str | Path,
    kind: str,
    *,
    split: str | None = None,
    fields: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Job dicts from a Hugging Face dataset on disk (a save_to_disk directory or data files)."""
    rows = _hf_rows(Path(path), split)
    jobs = []
    for index, row in enumerate(rows):
        if limit is not None and index >= limit:
            break
        task = rows_to_task(dict(row), kind, fields or {}, defaults or {})
        job: dict[str, Any] = {"task": task}
        if limits:
            job["limits"] = dict(limits)
        jobs.append(job)
    return jobs


def rows_to_task(
    row: dict[str, Any], kind: str, fields: Mapping[str, str], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """One dataset row as a task dict (see the module docstring)."""
    task = {fields.get(name, name): _plain(value) for name, value in row.items()}
    for name, value in defaults.items():
        if name not in task:
            task[name] = value.format(**row) if isinstance(value, str) else value
    task["kind"] = kind
    return task


def _plain(value: Any) -> Any:
    """Arrow scalars come back as Python values already; numpy arrays (lists of test ids) do not."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value


def _hf_rows(path: Path, split: str | None) -> Iterable[Mapping[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise LoaderError(
            "reading Hugging Face datasets needs the `datasets` package: pip install 'rollouts[data]'"
        ) from None
    if not path.exists():
        raise LoaderError(f"{path}: no such file or directory")
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        loaded = datasets.load_from_disk(str(path))
    else:
        files = sorted(p for p in path.iterdir() if p.suffix in _FILE_BUILDERS) if path.is_dir() else [path]
        builders = {_FILE_BUILDERS.get(p.suffix) for p in files}
        if not files or None in builders or len(builders) != 1:
            raise LoaderError(f"{path}: expected a save_to_disk directory or {', '.join(_FILE_BUILDERS)} files")
        loaded = datasets.load_dataset(builders.pop(), data_files=[str(p) for p in files], split=split or "train")
        return loaded
    if isinstance(loaded, datasets.DatasetDict):
        if split is None:
            if len(loaded) != 1:
                raise LoaderError(f"{path}: several splits ({', '.join(loaded)}); name one")
            split = next(iter(loaded))
        if split not in loaded:
            raise LoaderError(f"{path}: no split {split!r} (has {', '.join(loaded)})")
        return loaded[split]
    return loaded


def load_rows(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """Every row of a data file as a dict: JSONL read directly, anything else through `datasets`."""
    path = Path(path)
    if path.is_file() and path.suffix in (".jsonl", ".ndjson"):
        return [row for _, row in _jsonl_objects(path)]
    # A table has one schema: a column that a row lacks comes back as None there (drop it, so a file
    # mixing formats detects each row by the fields it has).
    return [
        {name: _plain(value) for name, value in dict(row).items() if value is not None} for row in _hf_rows(path, split)
    ]


def row_job(row: dict[str, Any], fmt: str | None = None) -> dict[str, Any]:
    """A row as a job: a job line (`task`) or a task of a named kind as it is, else a published row by its
    format (`fmt`, or detected). Raises FormatError naming what is missing."""
    if "task" in row and fmt is None:
        return row
    if "kind" in row and fmt is None:
        return {"task": row}
    return {"task": row_to_task(row, fmt)}
