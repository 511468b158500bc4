"""Submit a JSONL file of jobs, follow them (the client's one waiter) with a progress bar, and summarise per task kind."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from cli.loaders import load_rows, row_job
from cli.progress import Progress
from rollouts_client import ApiError, Job, JobStatus, RolloutClient, WaitTimeout
from shared.config import get_settings
from shared.kinds.formats import FormatError

SUBMIT_CHUNK = 500


def read_jobs(path: Path) -> list[dict[str, Any]]:
    jobs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            jobs.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    if not jobs:
        raise ValueError(f"{path}: no jobs in the file")
    return jobs


def read_row_jobs(path: Path, fmt: str | None, split: str | None = None) -> list[dict[str, Any]]:
    """Jobs from a file of job lines, tasks or published rows (JSONL, or parquet etc. through `datasets`);
    raises ValueError naming the row (1-based) that matches no format or lacks a field."""
    jobs = []
    for number, row in enumerate(load_rows(path, split), start=1):
        try:
            jobs.append(row_job(row, fmt))
        except FormatError as exc:
            raise ValueError(f"{path}: row {number}: {exc}") from None
    if not jobs:
        raise ValueError(f"{path}: no rows in the file")
    return jobs


_BODY_INDEX = re.compile(r"^body\[(\d+)\]")


def rows_of(error: ApiError) -> dict[int, str]:
    """A 422's problems by the 0-based index of the job (in the request) they name, as "field: message"."""
    problems: dict[int, str] = {}
    for problem in error.errors:
        match = _BODY_INDEX.match(str(problem.get("field", "")))
        if match is None:
            continue
        index = int(match.group(1))
        field = str(problem["field"])[match.end() :].lstrip(".")
        message = str(problem.get("message", "invalid"))
        text = f"{field}: {message}" if field else message  # no field: the job as a whole
        problems[index] = f"{problems[index]}; {text}" if index in problems else text
    return problems


class RowsRefused(ValueError):
    """The API refused rows of a file: each named (1-based) with its problem, nothing of them submitted."""


def submit_all(client: RolloutClient, jobs: list[dict[str, Any]]) -> list[str]:
    """Submit in chunks; a refused chunk raises RowsRefused naming each refused row (1-based)."""
    ids: list[str] = []
    for start in range(0, len(jobs), SUBMIT_CHUNK):
        chunk = jobs[start : start + SUBMIT_CHUNK]
        try:
            ids.extend(client.submit_jobs(chunk))
        except ApiError as exc:
            problems = rows_of(exc) if exc.status_code == 422 else {}
            if not problems:
                raise
            lines = [f"row {start + index + 1}: {text}" for index, text in sorted(problems.items())]
            raise RowsRefused("the API refused rows (nothing was submitted from them):\n" + "\n".join(lines)) from None
    return ids


def submit_each(client: RolloutClient, jobs: list[dict[str, Any]]) -> tuple[dict[int, str], dict[int, str]]:
    """Submit every job the API accepts: (job id by index, why it was refused by index)."""
    ids: dict[int, str] = {}
    refused: dict[int, str] = {}
    for start in range(0, len(jobs), SUBMIT_CHUNK):
        pending = list(range(start, min(start + SUBMIT_CHUNK, len(jobs))))
        while pending:
            try:
                submitted = client.submit_jobs([jobs[i] for i in pending])
            except ApiError as exc:
                problems = rows_of(exc) if exc.status_code == 422 else {}
                if not problems:
                    raise
                for position, text in problems.items():
                    refused[pending[position]] = text
                pending = [index for position, index in enumerate(pending) if position not in problems]
                continue
            ids.update(zip(pending, submitted))
            pending = []
    return ids, refused


def follow(
    client: RolloutClient,
    job_ids: list[str],
    *,
    progress: bool | None = None,
    poll_s: float = 0.5,
    timeout: float | None = None,
) -> dict[str, Job]:
    """Wait until every job is terminal (the client's watch_jobs, an answer at least every `poll_s`);
    returns the final summary of each job (no result) by id.

    Progress: a bar on a terminal, a line every ROLLOUTS_PROGRESS_INTERVAL_S elsewhere (cli/progress.py);
    `progress=False` shows none."""
    finished: dict[str, Job] = {}
    running = len(dict.fromkeys(job_ids))
    shown = Progress(running, "job", get_settings().progress_interval_s, enabled=progress is not False)
    ended: Counter[str] = Counter()
    try:
        for update in client.watch_jobs(job_ids, timeout, poll_s, update_s=poll_s):
            finished.update((job.id, job) for job in update.ended)
            ended.update(job.status for job in update.ended)
            running = len(update.running)
            shown.update(len(update.ended), ended=ended, running=Counter(job.status for job in update.running))
    except WaitTimeout:
        raise TimeoutError(f"{running} jobs still running after {timeout:.0f}s") from None
    finally:
        shown.close()
    return finished


def summary_table(summaries: list[Job]) -> str:
    """Per task kind: jobs, done, failed/other, mean reward, mean wall time."""
    by_kind: dict[str, list[Job]] = defaultdict(list)
    for summary in summaries:
        by_kind[summary.kind].append(summary)
    rows = [("kind", "jobs", "done", "not done", "reward mean", "time mean (s)")]
    for kind in sorted(by_kind):
        items = by_kind[kind]
        done = [s for s in items if s.status == JobStatus.DONE]
        rewards = [s.reward for s in done if s.reward is not None]
        times = [s.finished_at - s.created_at for s in items if s.finished_at]
        rows.append(
            (
                kind,
                str(len(items)),
                str(len(done)),
                str(len(items) - len(done)),
                f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
                f"{sum(times) / len(times):.2f}" if times else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def write_results(client: RolloutClient, job_ids: list[str], path: Path) -> None:
    """One full job record per line (JSONL), in submission order, as the API serves it."""
    with path.open("w") as out:
        for job_id in job_ids:
            out.write(json.dumps(client.get_job(job_id).raw) + "\n")
