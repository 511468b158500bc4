"""Client commands against a running API: `submit` and `status`."""

from __future__ import annotations

from pathlib import Path

import click

from cli.connect import connect
from cli.loaders import LoaderError
from cli.tracking import RowsRefused, follow, read_row_jobs, submit_all, summary_table, write_results
from shared.kinds.formats import FORMATS

_url_option = click.option("--url", default=None, help="API URL (default: ROLLOUTS_API_URL or host:port settings).")
format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="The rows' published format. Default: job lines and tasks as they are, other rows detected one by one.",
)
split_option = click.option("--split", default=None, help="The split of a save_to_disk dataset directory.")


@click.command()
@click.argument("jobs_file", type=click.Path(exists=True, path_type=Path))
@_url_option
@format_option
@split_option
@click.option("--wait/--no-wait", default=True, show_default=True, help="Follow the jobs to the end.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write finished jobs as JSONL.")
@click.option("--timeout", type=float, default=None, help="Stop waiting after this many seconds.")
def submit(
    jobs_file: Path,
    url: str | None,
    fmt: str | None,
    split: str | None,
    wait: bool,
    output: Path | None,
    timeout: float | None,
) -> None:
    """Submit JOBS_FILE and follow the jobs with a progress bar.

    JOBS_FILE holds job lines, tasks, or rows of a published data set (GSM8K, MATH, plain answer,
    MBPP, HumanEval, SWE-bench): JSONL, or parquet/arrow/CSV files or a save_to_disk directory.
    """
    client = connect(url)
    try:
        ids = submit_all(client, read_row_jobs(jobs_file, fmt, split))
        click.echo(f"submitted {len(ids)} jobs", err=True)
        if not wait:
            click.echo("\n".join(ids))
            return
        finished = follow(client, ids, timeout=timeout)
        click.echo(summary_table([finished[i] for i in dict.fromkeys(ids)]))
        if output:
            write_results(client, ids, output)
    except RowsRefused:
        raise  # explained by cli/failures.py, as an ApiError is
    except (ValueError, LoaderError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()


@click.command()
@_url_option
def status(url: str | None) -> None:
    """Queue depths, workers and in-flight jobs per stage."""
    client = connect(url)
    try:
        info = client.status()
    finally:
        client.close()
    click.echo(f"{'stage':8} {'queued':>7} {'running':>8} {'failed':>7} {'procs':>6} {'slots':>6} {'busy':>5}")
    for stage, s in info["stages"].items():
        click.echo(
            f"{stage:8} {s['queued']:>7} {s['running']:>8} {s['failed']:>7} "
            f"{s['processes']:>6} {s['slots']:>6} {s['busy_slots']:>5}"
        )
    jobs = ", ".join(f"{k} {v}" for k, v in info["jobs"].items() if v)
    click.echo(f"jobs: {jobs or 'none'}; in flight: {info['in_flight']}")
    if "redis" in info:  # servers before the results store do not report it
        redis, results = info["redis"], info["results"]
        limit = f"{redis['limit_bytes']} ({redis['high_water']:.0%} high-water)" if redis["limit_bytes"] else "no limit"
        refusing = "" if redis["accepting"] else "; REFUSING new jobs"
        click.echo(f"redis: {redis['used_bytes']} bytes of {limit}{refusing}")
        health = "ok" if results["healthy"] else f"UNHEALTHY: {results['reason']}"
        click.echo(f"results: {results['bytes']} bytes in {results['files']} files under {results['root']} ({health})")
    if info.get("restarts"):  # what `rollouts up` restarted since it started
        click.echo("restarts: " + ", ".join(f"{kind} {count}" for kind, count in sorted(info["restarts"].items())))
