"""`rollouts validate`: run every row's own reference through the evaluation a rollout gets.

Like SWE-bench's harness run with the gold predictions: each row becomes a job
whose `given` output is the row's reference (the gold patch, the reference
answer, the canonical solution), so the rollout stage skips the LLM and the
eval fleet judges it exactly as it judges a model's output, in parallel. Every
row ends in one of three verdicts: scored 1; scored less (and the evaluation's
reason); cannot be evaluated (refused at submission, or the job failed, and why).
These are the rows that could only ever reward 0, found before training on them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from cli.connect import connect
from cli.jobs import format_option, split_option
from cli.loaders import LoaderError, load_rows, row_job
from cli.tracking import follow, submit_each
from rollouts_client import ApiError, Job, RolloutClient
from workers.kinds.formats import FormatError

SCORED_1 = "scored 1"
SCORED_LESS = "scored less"
NOT_EVALUABLE = "cannot be evaluated"


@dataclass
class RowVerdict:
    row: int  # 1-based, in the file
    verdict: str
    reward: float | None = None
    why: str = ""
    job_id: str | None = None
    format: str | None = None


def reference_jobs(rows: list[dict[str, Any]], fmt: str | None) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """Each row as a job that evaluates its own reference (index -> job), and why the others cannot be."""
    jobs: dict[int, dict[str, Any]] = {}
    problems: dict[int, str] = {}
    for index, row in enumerate(rows):
        try:
            job = row_job(row, fmt)
        except FormatError as exc:
            problems[index] = str(exc)
            continue
        jobs[index] = {**job, "given": {"reference": True}}
    return [jobs.get(i, {}) for i in range(len(rows))], problems


def judge(client: RolloutClient, summary: Job) -> tuple[str, float | None, str]:
    """(verdict, reward, why) of a finished validation job."""
    if summary.status == "done" and summary.reward == 1.0:
        return SCORED_1, 1.0, ""
    job = client.get_job(summary.id)
    if summary.status == "done":
        evaluation = (job.result or {}).get("evaluation") or {}
        why = evaluation.get("reason") or evaluation.get("error") or json.dumps(evaluation)[:500]
        return SCORED_LESS, summary.reward, str(why)
    error = job.error or {}
    message = error.get("message") or error.get("reason") or summary.status
    where = f"{error['stage']}: " if error.get("stage") else ""
    return NOT_EVALUABLE, None, f"job {summary.status} ({where}{str(message).strip()[-500:]})"


def validate_rows(
    client: RolloutClient, rows: list[dict[str, Any]], fmt: str | None, timeout: float | None, progress: bool | None
) -> list[RowVerdict]:
    jobs, problems = reference_jobs(rows, fmt)
    wanted = [i for i in range(len(rows)) if i not in problems]
    ids, refused = submit_each(client, [jobs[i] for i in wanted])
    verdicts = {i: RowVerdict(i + 1, NOT_EVALUABLE, why=text) for i, text in problems.items()}
    for position, text in refused.items():
        index = wanted[position]
        verdicts[index] = RowVerdict(index + 1, NOT_EVALUABLE, why=f"refused at submission: {text}")
    by_job = {job_id: wanted[position] for position, job_id in ids.items()}
    finished = follow(client, list(by_job), progress=progress, timeout=timeout)
    for job_id, index in by_job.items():
        verdict, reward, why = judge(client, finished[job_id])
        fmt_name = jobs[index]["task"].get("format") or jobs[index]["task"].get("kind")
        verdicts[index] = RowVerdict(index + 1, verdict, reward, why, job_id, fmt_name)
    return [verdicts[i] for i in range(len(rows))]


def report(verdicts: list[RowVerdict]) -> str:
    lines = []
    for v in verdicts:
        reward = "-" if v.reward is None else f"{v.reward:g}"
        line = f"row {v.row:<5} {v.format or '?':<10} {reward:>5}  {v.verdict}"
        lines.append(line + (f": {v.why}" if v.why else ""))
    counts = {name: sum(1 for v in verdicts if v.verdict == name) for name in (SCORED_1, SCORED_LESS, NOT_EVALUABLE)}
    lines.append(f"{len(verdicts)} rows: " + ", ".join(f"{n} {name}" for name, n in counts.items()))
    return "\n".join(lines)


@click.command()
@click.argument("data_file", type=click.Path(exists=True, path_type=Path))
@click.option("--url", default=None, help="API URL (default: ROLLOUTS_API_URL or host:port settings).")
@format_option
@split_option
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the verdicts as JSONL.")
@click.option("--timeout", type=float, default=None, help="Stop waiting after this many seconds.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
def validate(
    data_file: Path,
    url: str | None,
    fmt: str | None,
    split: str | None,
    output: Path | None,
    timeout: float | None,
    progress: bool | None,
) -> None:
    """Evaluate every row's own reference (gold patch, reference answer, canonical solution) as a rollout
    would be evaluated, on the running service's eval fleet; report per row. Exit status 1 if any row
    does not score 1."""
    client = connect(url)
    try:
        verdicts = validate_rows(client, load_rows(data_file, split), fmt, timeout, progress)
    except (ApiError, LoaderError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()
    click.echo(report(verdicts))
    if output:
        with output.open("w") as out:
            for v in verdicts:
                out.write(json.dumps(asdict(v)) + "\n")
    if any(v.verdict != SCORED_1 for v in verdicts):
        raise SystemExit(1)
