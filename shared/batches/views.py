"""The public shapes of a batch and of a group (what the API serves and the client parses)."""

from __future__ import annotations

from typing import Any

from shared.batches.grpo import group_stats
from shared.batches.spec import group_id
from shared.batches.status import BatchStatus
from shared.jobs.status import JobStatus


def batch_view(head: dict[str, Any]) -> dict[str, Any]:
    """Status, target and the counts a progress bar needs; `filtered` is DAPO's uninformative groups."""
    dapo = head["mode"] == "dapo"
    return {
        "id": head["id"],
        "status": head["status"],
        "reason": exhausted_reason(head) if head["status"] == BatchStatus.EXHAUSTED else head.get("reason"),
        "mode": head["mode"],
        "n_samples": head["n"],
        "pool_size": head["pool_size"],
        "target": head["target"],
        "max_groups_in_flight": head["max_in_flight"],
        "on_target": head["on_target"],
        "advantages": head["advantages"],
        "created_at": head["created_at"],
        "finished_at": head.get("finished_at"),
        "counts": {
            "launched": head["launched"],
            "in_flight": head["in_flight"],
            "completed": head["completed"],
            "used": head["used"],
            "informative": head["informative"],
            "uniform": head["uniform"],
            "filtered": head["uniform"] if dapo else 0,
            "failed": head["failed"],
            "late": head["late"],
            "stale": head.get("stale", 0),
            "prompts_left": head["pool_size"] - head["cursor"],
        },
        "metadata": (head.get("request") or {}).get("metadata") or {},
    }


def exhausted_reason(head: dict[str, Any]) -> str:
    """Why a DAPO batch stopped short, in numbers: a trainer needs to know it was the data, not the service."""
    return (
        f"the batch's prompts ran out before the target: {head['used']} of {head['target']} groups informative "
        f"after {head['launched']} of {head['pool_size']} prompts ({head['uniform']} groups had one reward "
        f"for every sample, {head['failed']} failed, {head.get('stale', 0)} stale)"
    )


def group_view(
    head: dict[str, Any],
    k: int,
    group: dict[str, Any],
    prompt: dict[str, Any] | None,
    results: dict[str, dict[str, Any] | None] | None = None,
    result_errors: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One completed group: samples in order, rewards, mean, std, advantages; results when asked for."""
    samples = []
    for i in range(head["n"]):
        sample = group["samples"].get(i, {})
        entry: dict[str, Any] = {
            "sample_index": i,
            "job_id": sample.get("job_id"),
            "status": sample.get("status"),
            "reward": sample.get("reward"),
        }
        if results is not None:
            entry["result"] = results.get(sample.get("job_id") or "")
            if (result_errors or {}).get(sample.get("job_id") or ""):
                entry["result_error"] = (result_errors or {})[sample["job_id"]]
        samples.append(entry)
    rewards = [s["reward"] if s["status"] == JobStatus.DONE else None for s in samples]
    stats = group_stats(rewards, head["advantages"])
    return {
        "batch_id": head["id"],
        "group_id": group_id(head["id"], k),
        "prompt_index": k,
        "outcome": group.get("outcome"),
        "used": bool(group.get("used")),
        "launched_at": group.get("launched_at"),
        "completed_at": group.get("completed_at"),
        "error": group.get("error"),
        "prompt": prompt,
        "rewards": rewards,
        "mean": stats["mean"],
        "std": stats["std"],
        "advantages": stats["advantages"],
        "samples": samples,
    }
