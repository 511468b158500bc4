"""Job records as slime `Sample`s (THUDM/slime at 624b824a, 2026-08-21; radixark's miles, the PyPI `miles-rl`
0.0.2, keeps the fields used here): the samples the data source gave, filled from the record, never re-tokenized.

What slime's `RolloutManager._convert_samples_to_train_data` (slime/ray/rollout.py) reads from each sample:
`tokens` (prompt + response), `response_length`, `loss_mask` (over the response), `rollout_log_probs` (over
the response), `reward` (a float, group-normalized by `_post_process_rewards`), `status` (TRUNCATED counts as
truncated), `remove_sample` (its loss mask zeroed: the sample stays in its group's reward normalization),
`index`, `rollout_id` (slime only: siblings from one rollout share it), `metadata`, `weight_versions` (miles
passes them to training; one entry per generation call, as slime's generate appends `meta_info.weight_version`).
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
from typing import Any

from rollouts_client.models import Job
from rollouts_client.trainers.records import JobFailed, Split
from rollouts_client.trainers.rows import TASK_FIELD, RowError, task_from

TRUNCATING_STOPS = frozenset({"context_length"})  # the record's stop reason for a cut (docs/TRAJECTORY.md)


def sample_class() -> type:
    """slime's `Sample` (slime.utils.types), else miles' (the same contract): for rows the bridge reads itself."""
    try:
        from slime.utils.types import Sample  # type: ignore[import-not-found]
    except ImportError:
        try:
            from miles.utils.types import Sample  # type: ignore[import-not-found,no-redef]
        except ImportError:
            raise ImportError(
                "rollouts_client.trainers.slime runs inside slime (or miles): neither is importable"
            ) from None
    return Sample


def has_field(sample: Any, name: str) -> bool:
    """Whether this slime's Sample declares `name` (slime's and miles' differ: rollout_id, top-p replay, ...)."""
    return name in {f.name for f in dataclasses.fields(sample)}


def row_name(sample: Any) -> str:
    """How errors name a data-source sample: its index and its prompt group."""
    return f"{sample.index} (group {sample.group_index})"


def task_of(sample: Any) -> dict[str, Any]:
    """The service task of a sample: `metadata.rollouts_task` (slime's `--metadata-key` column); RowError if none."""
    row = row_name(sample)
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    if TASK_FIELD not in metadata:
        raise RowError(row, f"metadata.{TASK_FIELD}", "missing: the service task this row runs")
    return task_from(metadata[TASK_FIELD], row, f"metadata.{TASK_FIELD}")


def versions(split: Split) -> list[str]:
    """One weight version per assistant turn (slime appends one per generation call): the turn's spans' versions
    where the backend reported several, else its `policy_version`; turns that reported none are left out."""
    out: list[str] = []
    for turn in split.weight_versions:
        spans = [s.get("version") for s in turn.get("weight_versions") or []]
        names = spans if spans else [turn.get("policy_version")]
        out += [str(name) for name in names if name is not None]
    return out


def filled(prompt_sample: Any, job: Job, split: Split, attempts: int, segment: int, segments: int) -> Any:
    """A copy of the data source's sample holding one segment of the done job's record; a done job without a
    reward is an error (never 0)."""
    if job.reward is None:
        raise ValueError(f"job {job.id}: done without a reward (its kind's evaluation gave none)")
    sample = copy.deepcopy(prompt_sample)
    status = type(sample).Status
    sample.tokens = split.prompt_ids + split.response_ids
    sample.response_length = len(split.response_ids)
    sample.loss_mask = list(split.response_mask)
    sample.rollout_log_probs = list(split.response_logprobs)
    sample.reward = float(job.reward)
    sample.weight_versions = versions(split)
    sample.status = status.TRUNCATED if _truncated(job, split) else status.COMPLETED
    sample.remove_sample = False
    if has_field(sample, "rollout_id") and sample.rollout_id is None:
        sample.rollout_id = sample.index  # one rollout, whatever the number of segments
    sample.metadata = {
        **(sample.metadata or {}),
        "rollouts_job_id": job.id,
        "rollouts_attempts": attempts,
        "rollouts_stop_reason": split.stop_reason,
        "rollouts_weight_versions": split.weight_versions,
        "rollouts_segment": [segment, segments],
        "rollouts_earlier_segments": split.earlier_segments,
    }
    return sample


def removed(prompt_sample: Any, failure: JobFailed, group: list[Any]) -> Any:
    """A copy of the sample for a job that failed for good: `remove_sample` (slime zeroes its loss mask) and
    ABORTED, as slime's own examples mark an aborted rollout. slime still normalizes it with its group, so its
    reward is the mean of the group's done samples (the group's baseline unchanged, its own advantage 0), never
    a made-up score; its response is one masked token after the prompt of a done sibling (slime trains on
    nothing of it). A group with no done sample has no such value: JobFailed."""
    done = [s for s in group if not s.remove_sample]
    if not done:
        raise failure
    sample = copy.deepcopy(prompt_sample)
    sibling = done[0]
    prompt = list(sibling.tokens[: len(sibling.tokens) - sibling.response_length])
    sample.tokens = [*prompt, prompt[-1]]
    sample.response_length = 1
    sample.loss_mask = [0]
    sample.rollout_log_probs = [0.0]
    sample.reward = statistics.fmean(float(s.reward) for s in done)
    sample.weight_versions = []
    sample.status = type(sample).Status.ABORTED
    sample.remove_sample = True
    if has_field(sample, "rollout_id") and sample.rollout_id is None:
        sample.rollout_id = sample.index
    sample.metadata = {
        **(sample.metadata or {}),
        "rollouts_job_id": failure.job.id,
        "rollouts_attempts": failure.attempts,
        "rollouts_failed": str(failure),
    }
    return sample


def _truncated(job: Job, split: Split) -> bool:
    """Cut by a length limit: the record's stop reason, or its last assistant turn's finish reason `length`."""
    turns = [t for t in (job.trajectory or {}).get("turns") or [] if t.get("role") == "assistant"]
    last = turns[-1].get("finish_reason") if turns else None
    return split.stop_reason in TRUNCATING_STOPS or last == "length"
