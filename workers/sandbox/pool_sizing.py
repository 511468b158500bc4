"""How many ready sandboxes the pool wants, from what the worker could take next (pure: tested alone).

Ready sandboxes cost memory and a start each, so the pool keeps as many as the jobs this worker
could take soon: its free slots, but no more than its stage queue holds, plus one for the next
slot to free while the queue is longer than that, and always one while a profile is in use (the
next job should not start cold). Profiles share that number by how often jobs asked for them.
A profile no job asked for within the idle time wants none; the memory bound caps the total.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class Demand:
    """What the worker could take next: its free slots and its stage queue's depth."""

    free_slots: int
    queue_depth: int


@dataclass
class Asked:
    """How often, and when last, jobs asked for one profile."""

    last: float
    count: int = 1


def wanted_total(demand: Demand) -> int:
    """Ready sandboxes worth having now, over all profiles in use."""
    soon = min(demand.free_slots, demand.queue_depth)
    if demand.queue_depth > demand.free_slots:
        soon += 1  # the next slot to free takes a job at once
    return max(1, soon)


def targets(
    asked: dict[Hashable, Asked], demand: Demand, now: float, idle_s: float, max_ready: int
) -> dict[Hashable, int]:
    """Ready sandboxes wanted per profile: 0 for idle ones, at least 1 for each in use, ``max_ready`` in all."""
    active = {profile: seen for profile, seen in asked.items() if now - seen.last <= idle_s}
    out: dict[Hashable, int] = {profile: 0 for profile in asked}
    if not active or max_ready <= 0:
        return out
    total = min(wanted_total(demand), max_ready)
    asks = sum(seen.count for seen in active.values())
    recent_first = sorted(active, key=lambda p: active[p].last, reverse=True)
    left = max_ready
    for profile in recent_first:
        share = max(1, round(total * active[profile].count / asks))
        out[profile] = min(share, left)
        left -= out[profile]
    return out
