"""Add one ended job to the run page's aggregates: the counters of the minute it ended, in each scope.

Called once per job end by whoever moved the job (shared/job_end.py, and a batch's own cancels in
shared/batches/replenish.py): one read of the record, two of the model's weight versions when its
rollout recorded any, and one pipelined write. A job joins the scope `all`, its run's
(`metadata.run_id`, which the trainers' bridges stamp) and its batch's (`metadata.batch_id`).
Never raises: the job is over whatever its statistics do.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from shared.config import STAGES
from shared.jobs.record_fields import ROLLOUT_SUMMARY
from shared.jobs.status import TERMINAL, JobStatus
from shared.jobs.store import JobStore
from shared.keys import Keys
from shared.run_stats.fields import ALL, UNVERSIONED, bucket_of, name, scope
from shared.weights.versions import WeightVersions

log = logging.getLogger("rollouts.run_stats")
MAX_SCOPE_ID = 200  # a longer run or batch id joins no scope of its own

# (seq, label, versions behind) of the oldest weights that sampled a rollout; None when it recorded none.
VersionOf = Callable[[dict[str, Any]], tuple[int, str, int] | None]


@dataclass
class Observation:
    """What one ended job adds to its minute: counters, float sums, and labels (set, not added)."""

    counts: Counter[str] = field(default_factory=Counter)
    sums: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    def add(self, field_name: str, value: float) -> None:
        self.sums[field_name] = self.sums.get(field_name, 0.0) + value


def record_job_end(store: JobStore, job_id: str) -> None:
    """Add the ended job to its scopes' current minute; never raises."""
    try:
        record = store.get(job_id)
        if record is None or record.get("status") not in TERMINAL:
            return
        versions = WeightVersions(store.redis, store.keys)
        observation = observe(record, lambda summary: version_of(versions, summary))
        write(store.redis, store.keys, scopes_of(record), observation, time.time(), store.settings.job_ttl_s)
    except Exception:
        log.exception("job %s: not added to the run statistics", job_id)


def scopes_of(record: dict[str, Any]) -> list[str]:
    metadata = (record.get("spec") or {}).get("metadata") or {}
    scopes = [ALL]
    for kind, key in (("run", "run_id"), ("batch", "batch_id")):
        value = metadata.get(key)
        if isinstance(value, str) and 0 < len(value) <= MAX_SCOPE_ID:
            scopes.append(scope(kind, value))
    return scopes


def version_of(versions: WeightVersions, summary: dict[str, Any]) -> tuple[int, str, int] | None:
    """The oldest version that sampled the rollout (its number and label) and how far behind the
    model's current one it is now."""
    labels = [v for v in summary.get("versions") or [] if v]
    model = summary.get("model")
    if not model or not labels:
        return None
    seq, label = min(zip(versions.seqs(model, labels), labels))
    return seq, label, max(0, versions.current(model).seq - seq)


def observe(record: dict[str, Any], version: VersionOf) -> Observation:
    """The job's counters: its kind and status, reward by version, stage times, rollout numbers, why it failed."""
    seen = Observation()
    status, kind = str(record["status"]), str(record.get("kind") or "?")
    seen.counts[name("k", kind, status)] += 1
    for stage, seconds in stage_times(record).items():
        seen.counts[name("h", stage, bucket_of(seconds))] += 1
        seen.counts[name("hn", stage)] += 1
        seen.add(name("hs", stage), seconds)
    summary = record.get(ROLLOUT_SUMMARY)
    sampled = version(summary) if isinstance(summary, dict) else None
    if isinstance(summary, dict):
        _rollout(seen, summary, record, sampled)
    reward = record.get("reward")
    if status == JobStatus.DONE and isinstance(reward, (int, float)) and math.isfinite(reward):
        seq = str(sampled[0]) if sampled else UNVERSIONED
        seen.add(name("r", seq, kind, "s"), float(reward))
        seen.counts[name("r", seq, kind, "n")] += 1
        if sampled:
            seen.labels[name("vl", seq)] = sampled[1]
    if status != JobStatus.DONE:
        error = record.get("error") if isinstance(record.get("error"), dict) else {}
        where = " ".join(str(error[k]) for k in ("stage", "type") if error.get(k))
        seen.counts[name("fail", f"{status}: {where}" if where else status)] += 1
    return seen


def _rollout(seen: Observation, summary: dict[str, Any], record: dict[str, Any], sampled: Any) -> None:
    seen.counts[name("tok", "all")] += int(summary.get("tokens") or 0)
    seen.counts[name("tok", "gen")] += int(summary.get("generated") or 0)
    rollout = (record.get("timings") or {}).get("rollout") or {}
    if "started" in rollout and "ended" in rollout:
        seen.add(name("llm", "s"), float(summary.get("llm_s") or 0.0))
        seen.add(name("llm", "rollout_s"), max(0.0, rollout["ended"] - rollout["started"]))
    if summary.get("sandbox") in ("pool", "started"):
        seen.counts[name("sbx", summary["sandbox"])] += 1
    if sampled:
        seen.counts[name("stale", sampled[2])] += 1


def stage_times(record: dict[str, Any]) -> dict[str, float]:
    """Seconds waiting in queues (every stage's queued to started), in each stage, and submission to end."""
    timings = record.get("timings") or {}
    times: dict[str, float] = {}
    waits = [t["started"] - t["queued"] for s in STAGES if "started" in (t := timings.get(s) or {}) and "queued" in t]
    if waits:
        times["queue_wait"] = max(0.0, sum(waits))
    for stage in STAGES:
        t = timings.get(stage) or {}
        if "started" in t and "ended" in t:
            times[stage] = max(0.0, t["ended"] - t["started"])
    if record.get("finished_at") and record.get("created_at"):
        times["total"] = max(0.0, record["finished_at"] - record["created_at"])
    return times


def write(redis: Redis, keys: Keys, scopes: list[str], seen: Observation, now: float, ttl_s: int) -> None:
    """Add the observation to the minute of `now` in every scope, in one round trip; keys live `ttl_s`."""
    minute = int(now // 60 * 60)
    with redis.pipeline(transaction=False) as pipe:
        for each in scopes:
            key = keys.run_stats_minute(minute, each)
            for field_name, amount in seen.counts.items():
                pipe.hincrby(key, field_name, amount)
            for field_name, value in seen.sums.items():
                pipe.hincrbyfloat(key, field_name, value)
            if seen.labels:
                pipe.hset(key, mapping=seen.labels)
            pipe.expire(key, ttl_s)
            index = keys.run_stats_minutes(each)
            pipe.zadd(index, {str(minute): minute})
            pipe.zremrangebyscore(index, "-inf", f"({minute - ttl_s}")
            pipe.expire(index, ttl_s)
            if each != ALL:
                pipe.zadd(keys.run_stats_scopes, {each: now})
        pipe.zremrangebyscore(keys.run_stats_scopes, "-inf", f"({now - ttl_s}")
        pipe.execute()
