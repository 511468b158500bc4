"""Group statistics: reward mean and std, and per-sample advantages (GRPO normalisation).

Population std (divide by n), as GRPO implementations compute it over a group.
`mean` is the Dr. GRPO variant: centred rewards without std scaling, which does
not up-weight groups whose rewards barely differ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

STD_EPSILON = 1e-6


def group_stats(rewards: Sequence[float | None], advantages: str = "grpo") -> dict[str, Any]:
    """Mean, std and advantages of one group; samples without a reward (failed) get advantage None."""
    known = [float(r) for r in rewards if r is not None]
    if not known:
        return {"mean": None, "std": None, "advantages": [None] * len(rewards) if advantages != "none" else None}
    mean = sum(known) / len(known)
    std = math.sqrt(sum((r - mean) ** 2 for r in known) / len(known))
    if advantages == "none":
        values = None
    elif advantages == "mean":
        values = [None if r is None else float(r) - mean for r in rewards]
    elif advantages == "grpo":
        values = [None if r is None else (float(r) - mean) / (std + STD_EPSILON) for r in rewards]
    else:
        raise ValueError(f"unknown advantages mode {advantages!r}; one of grpo, mean, none")
    return {"mean": mean, "std": std, "advantages": values}
