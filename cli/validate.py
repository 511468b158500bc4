"""`rollouts validate`: run every row's own reference, or a model's answers, through the evaluation a rollout gets.

Like SWE-bench's harness run with the gold predictions: each row becomes a job
whose `given` output is the row's reference (the gold patch, the reference
answer, the canonical solution), so the rollout stage skips the LLM and the
eval fleet judges it exactly as it judges a model's output, in parallel. Every
row ends in one of three verdicts: scored 1; scored less (and the evaluation's
reason); cannot be evaluated (refused at submission, or the job failed, and why).
These are the rows that could only ever reward 0, found before training on them.

With `--answers FILE` (lines of `{"row": ..., "output": ...}`: a model's answers)
each output is judged instead, and every row reports what was extracted and by
which rule, so users can check the grader on their own model's outputs.
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
from rollouts_client import ApiError, Job, JobStatus, RolloutClient
from shared.kinds.formats import FormatError

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
    extracted: str | None = None  # the answer the evaluation read (answer tasks)
    source: str | None = None  # the rule that read it (workers/eval/answers.py)


Jobs = tuple[list[dict[str, Any]], dict[int, str]]


def reference_jobs(rows: list[dict[str, Any]], fmt: str | None) -> Jobs:
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


def answer_jobs(lines: list[dict[str, Any]], fmt: str | None) -> Jobs:
    """Each `{"row": ..., "output": ...}` line as a job that evaluates `output` on `row`, and why the others
    cannot be (the field named)."""
    jobs: dict[int, dict[str, Any]] = {}
    problems: dict[int, str] = {}
    for index, line in enumerate(lines):
        row, output = line.get("row"), line.get("output")
        if not isinstance(row, dict):
            problems[index] = "`row`: required, an object (a row of the data set, or a task)"
        elif not isinstance(output, str):
            problems[index] = "`output`: required, a string (the answer; a solution file for code, a patch for swe)"
        else:
            try:
                job = row_job(row, fmt)
            except FormatError as exc:
                problems[index] = f"`row`: {exc}"
                continue
            jobs[index] = {**job, "given": {"output": output}}
    return [jobs.get(i, {}) for i in range(len(lines))], problems


def judge(client: RolloutClient, summary: Job, details: bool = False) -> RowVerdict:
    """The verdict of a finished job (row and format filled in by the caller); `details`: always read the
    evaluation (what was extracted, by which rule, and why), not only for rows that scored less."""
    if summary.status == JobStatus.DONE and summary.reward == 1.0 and not details:
        return RowVerdict(0, SCORED_1, 1.0, job_id=summary.id)
    job = client.get_job(summary.id)
    if summary.status == JobStatus.DONE:
        evaluation = (job.result or {}).get("evaluation") or {}
        why = evaluation.get("reason") or evaluation.get("error") or json.dumps(evaluation)[:500]
        verdict = SCORED_1 if summary.reward == 1.0 else SCORED_LESS
        extracted, source = evaluation.get("extracted"), evaluation.get("source")
        return RowVerdict(0, verdict, summary.reward, str(why), summary.id, None, extracted, source)
    error = job.error or {}
    message = error.get("message") or error.get("reason") or summary.status
    where = f"{error['stage']}: " if error.get("stage") else ""
    why = f"job {summary.status} ({where}{str(message).strip()[-500:]})"
    return RowVerdict(0, NOT_EVALUABLE, None, why, summary.id)


def validate_rows(
    client: RolloutClient, prepared: Jobs, timeout: float | None, progress: bool | None, details: bool = False
) -> list[RowVerdict]:
    """Submit the prepared jobs, follow them, and give every row its verdict, in the file's order."""
    jobs, problems = prepared
    wanted = [i for i in range(len(jobs)) if i not in problems]
    ids, refused = submit_each(client, [jobs[i] for i in wanted])
    verdicts = {i: RowVerdict(i + 1, NOT_EVALUABLE, why=text) for i, text in problems.items()}
    for position, text in refused.items():
        index = wanted[position]
        verdicts[index] = RowVerdict(index + 1, NOT_EVALUABLE, why=f"refused at submission: {text}")
    by_job = {job_id: wanted[position] for position, job_id in ids.items()}
    finished = follow(client, list(by_job), progress=progress, timeout=timeout)
    for job_id, index in by_job.items():
        verdict = judge(client, finished[job_id], details)
        verdict.row = index + 1
        verdict.format = jobs[index]["task"].get("format") or jobs[index]["task"].get("kind")
        verdicts[index] = verdict
    return [verdicts[i] for i in range(len(jobs))]


def report(verdicts: list[RowVerdict]) -> str:
    """One line per row (reward, verdict, what was extracted and by which rule, why), then the counts."""
    lines = []
    for v in verdicts:
        reward = "-" if v.reward is None else f"{v.reward:g}"
        line = f"row {v.row:<5} {v.format or '?':<10} {reward:>5}  {v.verdict}"
        if v.source is not None:
            line += f"  [{v.extracted!r} by {v.source}]"
        lines.append(line + (f": {v.why}" if v.why else ""))
    counts = {name: sum(1 for v in verdicts if v.verdict == name) for name in (SCORED_1, SCORED_LESS, NOT_EVALUABLE)}
    lines.append(f"{len(verdicts)} rows: " + ", ".join(f"{n} {name}" for name, n in counts.items()))
    return "\n".join(lines)


@click.command()
@click.argument("data_file", type=click.Path(exists=True, path_type=Path), required=False)
@click.option(
    "--answers",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='Judge a model\'s answers instead: JSONL of {"row": <data set row>, "output": <answer>} lines.',
)
@click.option("--url", default=None, help="API URL (default: ROLLOUTS_API_URL or host:port settings).")
@format_option
@split_option
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the verdicts as JSONL.")
@click.option("--timeout", type=float, default=None, help="Stop waiting after this many seconds.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
def validate(
    data_file: Path | None,
    answers: Path | None,
    url: str | None,
    fmt: str | None,
    split: str | None,
    output: Path | None,
    timeout: float | None,
    progress: bool | None,
) -> None:
    """Evaluate every row's own reference (gold patch, reference answer, canonical solution) as a rollout
    would be evaluated, on the running service's eval fleet; report per row. Exit status 1 if any row
    does not score 1. With --answers, judge a model's answers and report what was read from each and
    by which rule; exit status 1 only if some row cannot be evaluated."""
    if (data_file is None) == (answers is None):
        raise click.UsageError("give a DATA_FILE (its references are judged) or --answers FILE, not both")
    client = connect(url)
    try:
        if answers is not None:
            prepared = answer_jobs(load_rows(answers), fmt)
        else:
            prepared = reference_jobs(load_rows(Path(str(data_file)), split), fmt)
        verdicts = validate_rows(client, prepared, timeout, progress, details=answers is not None)
    except (ApiError, LoaderError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()
    click.echo(report(verdicts))
    if output:
        with output.open("w") as out:
            for v in verdicts:
                out.write(json.dumps(asdict(v)) + "\n")
    if answers is not None:
        failed = any(v.verdict == NOT_EVALUABLE for v in verdicts)  # a wrong answer is a finding, not a failure
    else:
        failed = any(v.verdict != SCORED_1 for v in verdicts)
    if failed:
        raise SystemExit(1)
