"""What one minute's hash of a scope holds: its field names, and the buckets of its time histograms.

Every field is a counter or a sum, so a job's end is HINCRBY/HINCRBYFLOAT only and any window is
the field-wise sum of its minutes. Names are `|`-separated; a value from outside (a kind, an error
type) has `|` replaced, so it can never shift the parts after it.

| field | what |
|---|---|
| `k|<kind>|<status>` | jobs of the kind that ended in the status |
| `r|<seq>|<kind>|s`, `r|<seq>|<kind>|n` | reward sum and count of done jobs, by the weight version (its number; `-`: none recorded) the sample started on |
| `vl|<seq>` | that version's label (set, not added) |
| `h|<stage>|<bucket>`, `hs|<stage>`, `hn|<stage>` | a stage time's histogram, sum and count (stages: `TIMED`) |
| `tok|all`, `tok|gen` | tokens of finished rollouts, and those the model generated |
| `llm|s`, `llm|rollout_s` | the LLM's seconds in finished rollouts, and those rollouts' stage seconds |
| `stale|<n>` | finished rollouts whose oldest version was n updates behind the model's current one at the job's end |
| `fail|<reason>` | jobs that did not end done, by `<status>: <stage> <error type>` |
| `sbx|pool`, `sbx|started` | finished rollouts whose sandbox came from the pool, or was started for them |
"""

from __future__ import annotations

import math

SEP = "|"
UNVERSIONED = "-"
ALL = "all"  # the scope every job joins; a window over it is "the service, from when to when"
SCOPE_KINDS = ("run", "batch")
# The stage times kept: waiting in queues (all stages), each stage's run, and submission to end.
TIMED = ("queue_wait", "init", "rollout", "eval", "total")
# Histogram buckets are log-spaced, 20 per decade (each 12% wider than the one before): a percentile
# read from them is within 12% of the true one, from 1 ms to days, in a few dozen fields.
PER_DECADE = 20
FLOOR_S = 0.001


def part(value: object) -> str:
    """A value from outside as one part of a field name."""
    return str(value).replace(SEP, "/")


def name(*parts: object) -> str:
    return SEP.join(part(p) for p in parts)


def bucket_of(seconds: float) -> int:
    """The histogram bucket holding `seconds`: [10**(i/20), 10**((i+1)/20))."""
    return math.floor(math.log10(max(seconds, FLOOR_S)) * PER_DECADE)


def bucket_bounds(index: int) -> tuple[float, float]:
    return 10 ** (index / PER_DECADE), 10 ** ((index + 1) / PER_DECADE)


def quantile(buckets: dict[int, int], q: float) -> float | None:
    """The q-quantile of a histogram, interpolated geometrically inside its bucket (as Prometheus'
    histogram_quantile does linearly); None for an empty one."""
    total = sum(buckets.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(buckets):
        count = buckets[index]
        if count <= 0:
            continue
        if seen + count >= rank:
            low, high = bucket_bounds(index)
            return float(low * (high / low) ** ((rank - seen) / count))
        seen += count
    return bucket_bounds(max(buckets))[1]


def scope(kind: str, scope_id: str) -> str:
    """A run's or a batch's scope: `run:<id>`, `batch:<id>`."""
    return f"{kind}:{scope_id}"
