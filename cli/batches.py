"""`rollouts batch` (create a batch, follow it with a progress bar) and `rollouts export` (JSONL)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

import click

from cli.connect import connect
from cli.progress import Progress
from cli.tracking import read_jobs
from rollouts_client import Batch, BatchExhausted, BatchStatus, Group, RolloutClient, WaitTimeout
from shared.config import get_settings

POLL_WAIT_S = 2.0
_url_option = click.option("--url", default=None, help="API URL (default: ROLLOUTS_API_URL or host:port settings).")


@click.command()
@click.argument("prompts_file", type=click.Path(dir_okay=False, path_type=Path))
@_url_option
@click.option("-n", "--n-samples", type=int, default=8, show_default=True, help="Samples per prompt (group size).")
@click.option("--min-informative", type=int, default=None, help="DAPO: stop after this many informative groups.")
@click.option("--max-in-flight", type=int, default=None, help="Groups running at once (default: the target).")
@click.option("--on-target", type=click.Choice(["cancel", "keep"]), default="cancel", show_default=True)
@click.option("--advantages", type=click.Choice(["grpo", "mean", "none"]), default="grpo", show_default=True)
@click.option("--server-side", is_flag=True, help="PROMPTS_FILE is a path the API server reads (not uploaded).")
@click.option(
    "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write each group as it completes (JSONL)."
)
@click.option("--wait/--no-wait", default=True, show_default=True, help="Follow the batch to the end.")
@click.option("--timeout", type=float, default=None, help="Stop following after this many seconds.")
def batch(
    prompts_file: Path,
    url: str | None,
    n_samples: int,
    min_informative: int | None,
    max_in_flight: int | None,
    on_target: str,
    advantages: str,
    server_side: bool,
    output: Path | None,
    wait: bool,
    timeout: float | None,
) -> None:
    """Create a batch from PROMPTS_FILE (one task or job per line) and follow it with a progress bar."""
    options: dict[str, Any] = {"on_target": on_target, "advantages": advantages}
    if max_in_flight:
        options["max_groups_in_flight"] = max_in_flight
    client = connect(url)
    try:
        if server_side:
            created = client.submit_batch(
                prompts_path=str(prompts_file), n_samples=n_samples, min_informative_groups=min_informative, **options
            )
        else:
            prompts = read_jobs(prompts_file)
            created = client.submit_batch(
                prompts, n_samples=n_samples, min_informative_groups=min_informative, **options
            )
        click.echo(f"batch {created.id}: {created.pool_size} prompts, target {created.target} groups", err=True)
        if not wait:
            click.echo(created.id)
            return
        out = output.open("w") if output else None
        try:
            final = follow_batch(client, created, out, timeout)
        finally:
            if out:
                out.close()
        click.echo(summary_line(final))
        if final.status == BatchStatus.EXHAUSTED:
            raise BatchExhausted(final)  # cli/failures.py: its reason, and a distinct exit code
    except (ValueError, WaitTimeout) as exc:  # an ApiError is explained by cli/failures.py
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()


def follow_batch(client: RolloutClient, created: Batch, out: IO[str] | None, timeout: float | None) -> Batch:
    """Long-poll the batch's groups; the bar counts used groups toward the target (tqdm adds rate and ETA).

    Each page carries the batch's counts, so the bar's filtered / in-flight figures refresh at
    least every POLL_WAIT_S even while no group completes.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = Progress(created.target, "group", get_settings().progress_interval_s)
    cursor, batch = "0-0", created
    try:
        while True:
            page = client.groups(created.id, cursor, POLL_WAIT_S, results=out is not None)
            used = 0
            for group in page.groups:
                used += group.used
                if out is not None:
                    out.write(json.dumps(group_record(group)) + "\n")
            cursor, batch = page.cursor, page.batch
            c = batch.counts
            shown.update(used, ended={"filtered": c.filtered, "failed": c.failed}, running={"groups": c.in_flight})
            if page.done:
                return client.get_batch(created.id)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"batch {created.id} still running after {timeout}s (it goes on; see `export`)")
    finally:
        shown.close()


def summary_line(batch: Batch) -> str:
    c = batch.counts
    return (
        f"batch {batch.id} {batch.status}: used {c.used}/{batch.target}, launched {c.launched}, "
        f"filtered {c.filtered}, failed {c.failed}, late {c.late}"
    )


def group_record(group: Group) -> dict[str, Any]:
    return {
        "batch_id": group.batch_id,
        "group_id": group.group_id,
        "prompt_index": group.prompt_index,
        "outcome": group.outcome,
        "used": group.used,
        "rewards": group.rewards,
        "mean": group.mean,
        "std": group.std,
        "advantages": group.advantages,
        "error": group.error,
        "prompt": group.prompt,
        "samples": [vars(sample) for sample in group.samples],
    }


@click.command()
@click.argument("batch_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True)
@_url_option
@click.option("--groups", "per_group", is_flag=True, help="One line per group instead of one per sample.")
@click.option("--all-groups", is_flag=True, help="Also export reported groups that are not used (failed).")
@click.option("--timeout", type=float, default=None, help="Wait at most this long for a running batch.")
def export(
    batch_id: str, output: Path, url: str | None, per_group: bool, all_groups: bool, timeout: float | None
) -> None:
    """Write a batch's groups, with trajectories, to OUTPUT as JSONL (waits for a running batch)."""
    client = connect(url)
    lines = 0
    try:
        with output.open("w") as out:
            # partial: an exhausted batch exports the groups it did fill (`rollouts batch` says why it stopped)
            for group in client.iter_groups(batch_id, results=True, timeout=timeout, partial=True):
                if not (group.used or all_groups):
                    continue
                record = group_record(group)
                rows = [record] if per_group else sample_rows(record)
                for row in rows:
                    out.write(json.dumps(row) + "\n")
                    lines += 1
    except WaitTimeout as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()
    click.echo(f"wrote {lines} lines to {output}", err=True)


def sample_rows(group: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per sample: the group's identity and statistics, the sample's reward, advantage and result."""
    shared = {k: group[k] for k in ("batch_id", "group_id", "prompt_index", "outcome", "mean", "std")}
    return [{**shared, **sample} for sample in group["samples"]]
