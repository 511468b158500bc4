"""SmolLM2's reward per task kind through the service, before any training: the table in docs/TRAINING.md.

A few jobs of each kind from the examples' files (examples/<kind>.jsonl: real-format rows),
submitted with rollouts_client to a stack serving SmolLM2, sampled as GRPO samples
(temperature 1). A failed job is counted apart, with its error type: an infrastructure
failure is not a reward of 0.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.tracking import follow, submit_all, write_results
from rollouts_client import Job, RolloutClient

KINDS = ("math", "stem", "code", "swe")
EXAMPLES = Path(__file__).resolve().parents[1]


@dataclass
class KindRow:
    kind: str
    jobs: int
    done: int = 0
    rewards: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # created -> finished, per job
    failures: Counter[str] = field(default_factory=Counter)  # error type -> jobs

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


def kind_jobs(kind: str, per_kind: int, max_tokens: int, max_turns: int) -> list[dict[str, Any]]:
    """The first `per_kind` rows of examples/<kind>.jsonl, with this table's sampling and turn cap."""
    lines = [json.loads(line) for line in (EXAMPLES / f"{kind}.jsonl").read_text().splitlines() if line.strip()]
    jobs = []
    for row in lines[:per_kind]:
        limits = {**row.get("limits", {}), "max_turns": max_turns}
        jobs.append(
            {
                **row,
                "limits": limits,
                "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": max_tokens},
                "metadata": {"table": "smollm2-rewards"},
            }
        )
    return jobs


def reward_table(
    client: RolloutClient,
    per_kind: int = 3,
    max_tokens: int = 512,
    max_turns: int = 4,
    timeout: float = 900.0,
    results: Path | None = None,
) -> list[KindRow]:
    """Submit every kind's jobs at once and wait for all of them; one row per kind (`results`: every job as JSONL)."""
    jobs = [job for kind in KINDS for job in kind_jobs(kind, per_kind, max_tokens, max_turns)]
    ids = submit_all(client, jobs)
    finished = follow(client, ids, progress=False, timeout=timeout)
    if results is not None:
        write_results(client, ids, results)
    rows = {kind: KindRow(kind, 0) for kind in KINDS}
    for job_id in ids:
        summary = finished[job_id]
        row = rows[summary.kind]
        row.jobs += 1
        if summary.finished_at:
            row.seconds.append(summary.finished_at - summary.created_at)
        if summary.status == "done" and summary.reward is not None:
            row.done += 1
            row.rewards.append(float(summary.reward))
        else:
            row.failures[_failure(summary)] += 1
    return list(rows.values())


def _failure(job: Job) -> str:
    return str((job.error or {}).get("type") or job.status)


def markdown(rows: list[KindRow], wall_s: float) -> str:
    lines = [
        "| kind | jobs | done | mean reward | rewards | mean time per job (s) | failed (type) |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for row in rows:
        mean = f"{row.mean_reward:.3f}" if row.mean_reward is not None else "-"
        seconds = f"{sum(row.seconds) / len(row.seconds):.0f}" if row.seconds else "-"
        failed = ", ".join(f"{n} {kind}" for kind, n in row.failures.items()) or "0"
        rewards = " ".join(f"{r:g}" for r in row.rewards) or "-"
        lines.append(f"| {row.kind} | {row.jobs} | {row.done} | {mean} | {rewards} | {seconds} | {failed} |")
    lines.append(f"\nall kinds at once: {wall_s:.0f} s wall time")
    return "\n".join(lines)


def run_table(client: RolloutClient, out: Path, per_kind: int, max_tokens: int, max_turns: int) -> str:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = reward_table(client, per_kind, max_tokens, max_turns, results=out / "rewards.jsonl")
    text = markdown(rows, time.perf_counter() - started)
    (out / "rewards.md").write_text(text + "\n")
    return text
