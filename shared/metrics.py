"""Worker-side metrics, aggregated in Redis so one scrape of the API's /metrics sees every worker.

Workers are many short-lived processes (Slurm array tasks on many nodes); Prometheus cannot
find them all, and a per-process registry would lose its counts when the process ends. So each
observation is a few HINCRBY/HINCRBYFLOAT on one hash per metric family, and the API turns
the hashes into Prometheus families at scrape time (api/metrics.py). Counts live as long as
the Redis data does.

A histogram hash has, per label set `a|b`, fields `a|b|<bucket index>` (observations that fell
into that bucket, not cumulative), `a|b|sum` and `a|b|count`. Recording never raises: a metric
is not worth failing a job for.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from shared.jobs.status import AttemptResult

log = logging.getLogger("rollouts.metrics")

LABEL_SEP = "|"
INF = math.inf


@dataclass(frozen=True)
class HistogramFamily:
    name: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...]  # upper bounds, ending with +Inf

    def bucket_index(self, value: float) -> int:
        return bisect.bisect_left(self.buckets, value)


@dataclass(frozen=True)
class CounterFamily:
    name: str
    help: str
    labels: tuple[str, ...]


STAGE_SECONDS = HistogramFamily(
    "rollouts_stage_duration_seconds",
    "Wall time of one stage attempt, by stage and outcome (ok, failed, timed_out, cancelled, requeued, waiting_for_backend).",
    ("stage", "outcome"),
    (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, INF),
)
TOOL_SECONDS = HistogramFamily(
    "rollouts_tool_call_duration_seconds",
    "Wall time of one tool call in a sandbox, by tool.",
    ("tool",),
    (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, INF),
)
ERRORS = CounterFamily(
    "rollouts_errors",
    "Stage attempts that ended in an error, by stage and kind (exception type, timeout, worker_lost, ...).",
    ("stage", "kind"),
)

HISTOGRAMS = (STAGE_SECONDS, TOOL_SECONDS)
COUNTERS = (ERRORS,)


def metric_key(prefix: str, family: HistogramFamily | CounterFamily) -> str:
    """Hash holding one family's aggregates."""
    return f"{prefix}:metrics:{family.name}"


def _label_field(values: Iterable[str]) -> str:
    # Label values come from our own code (stage names, exception class names, tool names);
    # the separator is replaced so a value can never shift the others.
    return LABEL_SEP.join(str(v).replace(LABEL_SEP, "/") for v in values)


class MetricsRecorder:
    """Adds observations to the Redis aggregates; one per process, thread-safe.

    `buffered`: observations are summed in memory and written by `flush()` (a worker's
    supervisor calls it every heartbeat), so a stage attempt pays no round trip for metrics.
    """

    def __init__(self, redis: Redis, prefix: str, buffered: bool = False) -> None:
        self.redis = redis
        self.prefix = prefix
        self.buffered = buffered
        self._lock = threading.Lock()
        self._pending_counts: dict[str, dict[str, int]] = {}
        self._pending_sums: dict[str, dict[str, float]] = {}

    def observe(self, family: HistogramFamily, labels: tuple[str, ...], values: Iterable[float]) -> None:
        """Add observations (all with the same labels) to a histogram in one round trip."""
        self.observe_many(family, [(labels, v) for v in values])

    def observe_many(self, family: HistogramFamily, observations: Iterable[tuple[tuple[str, ...], float]]) -> None:
        key = metric_key(self.prefix, family)
        increments: dict[str, int] = {}
        sums: dict[str, float] = {}
        for labels, value in observations:
            if not isinstance(value, (int, float)) or math.isnan(value):
                continue
            base = _label_field(labels)
            bucket = f"{base}{LABEL_SEP}{family.bucket_index(float(value))}"
            increments[bucket] = increments.get(bucket, 0) + 1
            increments[f"{base}{LABEL_SEP}count"] = increments.get(f"{base}{LABEL_SEP}count", 0) + 1
            sums[f"{base}{LABEL_SEP}sum"] = sums.get(f"{base}{LABEL_SEP}sum", 0.0) + float(value)
        if increments:
            self._write(key, increments, sums)

    def count(self, family: CounterFamily, labels: tuple[str, ...], amount: int = 1) -> None:
        self._write(metric_key(self.prefix, family), {_label_field(labels): amount}, {})

    def _write(self, key: str, increments: Mapping[str, int], sums: Mapping[str, float]) -> None:
        if not self.buffered:
            self._send({key: dict(increments)}, {key: dict(sums)})
            return
        with self._lock:
            counts = self._pending_counts.setdefault(key, {})
            for field, amount in increments.items():
                counts[field] = counts.get(field, 0) + amount
            totals = self._pending_sums.setdefault(key, {})
            for field, value in sums.items():
                totals[field] = totals.get(field, 0.0) + value

    def flush(self) -> None:
        """Write what was buffered in one round trip; on a Redis error it is dropped, not retried."""
        with self._lock:
            counts, self._pending_counts = self._pending_counts, {}
            sums, self._pending_sums = self._pending_sums, {}
        if counts or sums:
            self._send(counts, sums)

    def _send(self, counts: Mapping[str, Mapping[str, int]], sums: Mapping[str, Mapping[str, float]]) -> None:
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                for key, fields in counts.items():
                    for field, amount in fields.items():
                        pipe.hincrby(key, field, amount)
                for key, fields in sums.items():
                    for field, value in fields.items():
                        pipe.hincrbyfloat(key, field, value)
                pipe.execute()
        except RedisError as exc:
            log.warning("metrics not recorded (%s: %s)", type(exc).__name__, exc)

    # --- what the stage runner reports --------------------------------------------------
    def stage_attempt(self, stage: str, outcome: str, seconds: float) -> None:
        """One stage attempt ended; `outcome` is the runner's return value."""
        label = stage_outcome(outcome)
        if label is not None:
            self.observe(STAGE_SECONDS, (stage, label), [seconds])

    def error(self, stage: str, kind: str) -> None:
        self.count(ERRORS, (stage, kind))

    def tool_calls(self, output: Any) -> None:
        """Tool-call latencies from a finished rollout's output, when it is a trajectory (docs/TRAJECTORY.md)."""
        self.observe_many(TOOL_SECONDS, tool_call_durations(output))


_LABELLED_RESULTS = frozenset(
    {
        AttemptResult.FAILED,
        AttemptResult.TIMED_OUT,
        AttemptResult.CANCELLED,
        AttemptResult.REQUEUED,
        AttemptResult.SUPERSEDED,
        AttemptResult.WAITING_FOR_BACKEND,
    }
)


def stage_outcome(outcome: str) -> str | None:
    """The runner's result as a latency label; None for attempts that did not run (skipped, lost races)."""
    if outcome == AttemptResult.DONE or outcome.startswith(AttemptResult.QUEUED.at("")):
        return "ok"
    if outcome in _LABELLED_RESULTS:
        return str(outcome)
    return None


def tool_call_durations(output: Any) -> list[tuple[tuple[str, ...], float]]:
    """(tool name,), seconds for every tool call that ran; refused calls (malformed, unknown tool) never ran.

    A task kind's rollout may return anything (a non-agentic kind has no trajectory): whatever
    does not have the trajectory's shape is skipped, never an error.
    """
    found: list[tuple[tuple[str, ...], float]] = []
    turns = output.get("turns") if isinstance(output, Mapping) else None
    for turn in turns if isinstance(turns, list) else []:
        calls = turn.get("tool_calls") if isinstance(turn, Mapping) else None
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, Mapping) or call.get("error"):
                continue
            seconds = call.get("duration_s")
            if isinstance(seconds, (int, float)):
                found.append(((str(call.get("name") or "invalid"),), float(seconds)))
    return found
