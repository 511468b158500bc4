"""Groups to training tensors: the trainer helper of the agent loop (shared.training), plus advantages.

Rows are the samples of the given groups that are done, in group order; a
failed sample has no reward to learn from and is left out. Alongside
`collate_trajectories`' arrays this adds per-row `advantages`, `rewards` and
`group_index` (the position of the row's group in the list given).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rollouts_client.models import Group
from shared.training import collate_trajectories


def groups_to_tensors(
    groups: Sequence[Group],
    *,
    pad_token_id: int = 0,
    padding_side: str = "right",
    max_length: int | None = None,
    tensors: str = "auto",
    used_only: bool = True,
) -> dict[str, Any]:
    """Groups fetched with results=True as one padded batch; `used_only` keeps the target's groups."""
    trajectories: list[dict[str, Any]] = []
    advantages: list[float] = []
    rewards: list[float] = []
    group_index: list[int] = []
    for index, group in enumerate(groups):
        if used_only and not group.used:
            continue
        for sample in group.samples:
            if sample.status != "done":
                continue
            if sample.trajectory is None:
                raise ValueError(f"group {group.group_id}: fetch groups with results=True to get trajectories")
            trajectories.append(sample.trajectory)
            advantages.append(0.0 if sample.advantage is None else float(sample.advantage))
            rewards.append(float(sample.reward or 0.0))
            group_index.append(index)
    batch = collate_trajectories(
        trajectories, pad_token_id=pad_token_id, padding_side=padding_side, max_length=max_length, tensors=tensors
    )
    extra = {
        "advantages": np.array(advantages, dtype=np.float32),
        "rewards": np.array(rewards, dtype=np.float32),
        "group_index": np.array(group_index, dtype=np.int64),
    }
    if not isinstance(batch["input_ids"], np.ndarray):
        import torch

        extra = {name: torch.from_numpy(array) for name, array in extra.items()}
    batch.update(extra)
    return batch
