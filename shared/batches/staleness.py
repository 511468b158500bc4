"""AReaL's staleness bound on a batch: a trajectory sampled too many weight versions ago is not trainable.

A batch with `max_staleness: k` admits a done sample only if every assistant turn was sampled by
weights at most k updates older than the model's current ones. Versions are ordered by the weight
update call (shared/weights/versions.py: sequence 1, 2, ...; the start-up weights are 0), and each
turn records the versions vLLM reported for its tokens (`weight_versions`, else `policy_version`).
A stale sample is recorded as `stale`: its group is not delivered, the batch counts it
(`counts.stale`) and, being short of its target, launches the next prompt instead.
"""

from __future__ import annotations

from shared.jobs.record_fields import output_field
from shared.jobs.store import JobStore
from shared.trajectory import turn_versions
from shared.weights.versions import WeightVersions

STALE = "stale"
__all__ = ["STALE", "is_stale", "turn_versions"]


def is_stale(jobs: JobStore, job_id: str, max_staleness: int) -> bool:
    """Whether the done job's oldest turn is more than `max_staleness` updates behind its model's current weights."""
    record = jobs.get(job_id)
    if record is None:
        return False
    trajectory = jobs.with_outputs(record).get(output_field("rollout")) or {}
    model, versions = turn_versions(trajectory)
    if not model or not versions:
        return False
    registry = WeightVersions(jobs.redis, jobs.keys)
    oldest = min(registry.seqs(model, versions))
    return registry.current(model).seq - oldest > max_staleness
