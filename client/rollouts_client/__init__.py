"""The trainer's client of the rollout service: sync and async, typed results, training tensors.

from rollouts_client import RolloutClient, groups_to_tensors

with RolloutClient("http://api:8000", token="...") as client:
    batch = client.submit_batch(prompts, n_samples=8, min_informative_groups=32)
    for group in client.iter_groups(batch.id):  # as each group completes (BatchExhausted: prompts ran out)
        ...
"""

from rollouts_client.aio import AsyncRolloutClient
from rollouts_client.errors import ApiError, BatchExhausted, RolloutsClientError, WaitTimeout
from rollouts_client.models import (
    TERMINAL_STATUSES,
    Batch,
    BatchCounts,
    BatchStatus,
    Group,
    GroupPage,
    Job,
    JobsProgress,
    JobStatus,
    Sample,
)
from rollouts_client.sync import RolloutClient
from rollouts_client.training import collate_trajectories, groups_to_tensors
from rollouts_client.wire import RetryPolicy

__all__ = [
    "TERMINAL_STATUSES",
    "ApiError",
    "AsyncRolloutClient",
    "Batch",
    "BatchCounts",
    "BatchExhausted",
    "BatchStatus",
    "Group",
    "GroupPage",
    "Job",
    "JobStatus",
    "JobsProgress",
    "RetryPolicy",
    "RolloutClient",
    "RolloutsClientError",
    "Sample",
    "WaitTimeout",
    "collate_trajectories",
    "groups_to_tensors",
]
