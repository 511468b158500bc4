"""The run page's numbers for one scope and window, read from the minute hashes that job ends add to.

One ZRANGEBYSCORE and one pipelined HGETALL per minute in which a job of the scope ended: a refresh
costs the window's busy minutes, never its jobs. Everything is summed field-wise over those minutes
(shared/run_stats/fields.py), so the numbers are to the minute: a window starts and ends on one.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from redis import Redis

from shared.errors import ValidationError
from shared.jobs.status import JobStatus
from shared.jobs.store import JobStore
from shared.keys import Keys
from shared.run_stats.fields import ALL, SEP, TIMED, UNVERSIONED, quantile, scope

STATUSES = (JobStatus.DONE.value, JobStatus.FAILED.value, JobStatus.TIMED_OUT.value, JobStatus.CANCELLED.value)
RECENT = 20  # runs and batches listed for the page's picker
CSV_HEADER = ("section", "key", "field", "value")
DEFAULT_WINDOW_S = 3600.0  # the service's jobs without a run or batch: the last hour, unless told
# What a minute's row carries (the window's totals carry every number).
MINUTE = ("jobs", *STATUSES, "rewards", "reward_mean", "generated_tokens", "tokens_per_s", "llm_share")


@dataclass(frozen=True)
class Window:
    """A scope (`all`, `run:<id>`, `batch:<id>`) between two times, epoch seconds."""

    scope: str
    since: float
    until: float


def window_of(batch_id: str | None, run_id: str | None, since: float | None, until: float | None, now: float) -> Window:
    """The window a query asks for: a batch's or a run's whole life by default, the service's last hour
    without either. ValidationError naming the query field otherwise."""
    if batch_id is not None and run_id is not None:
        raise ValidationError("give a batch_id or a run_id, not both", ("query", "run_id"))
    for field, value in (("since", since), ("until", until)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValidationError("epoch seconds: a finite number >= 0", ("query", field))
    until = now if until is None else until
    if batch_id is not None:
        chosen, start = scope("batch", batch_id), 0.0
    elif run_id is not None:
        chosen, start = scope("run", run_id), 0.0
    else:
        chosen, start = ALL, until - DEFAULT_WINDOW_S
    since = start if since is None else since
    if since > until:
        raise ValidationError("since is after until", ("query", "since"))
    return Window(chosen, since, until)


def run_stats(store: JobStore, window: Window) -> dict[str, Any]:
    """Every number the run page shows, with the recent runs and batches to pick from."""
    redis, keys = store.redis, store.keys
    stats = summarize(window, read_minutes(redis, keys, window))
    rows = redis.zrevrange(keys.run_stats_scopes, 0, RECENT - 1, withscores=True)
    recent = [_text(member).partition(":") for member, _ in rows]
    stats["recent"] = [
        {"kind": kind, "id": scope_id, "last_end": score} for (kind, _, scope_id), (_, score) in zip(recent, rows)
    ]
    return stats


def read_minutes(redis: Redis, keys: Keys, window: Window) -> list[tuple[int, dict[str, str]]]:
    """(minute, its hash) for every minute of the window in which a job of the scope ended, oldest first."""
    first = math.floor(window.since / 60) * 60
    minutes = sorted(int(m) for m in redis.zrangebyscore(keys.run_stats_minutes(window.scope), first, window.until))
    with redis.pipeline(transaction=False) as pipe:
        for minute in minutes:
            pipe.hgetall(keys.run_stats_minute(minute, window.scope))
        hashes = pipe.execute() if minutes else []
    return [(m, {_text(k): _text(v) for k, v in raw.items()}) for m, raw in zip(minutes, hashes) if raw]


def summarize(window: Window, minutes: list[tuple[int, dict[str, str]]]) -> dict[str, Any]:
    """The numbers of the window from its minutes' hashes."""
    merged: Counter[str] = Counter()
    labels: dict[str, str] = {}
    rows = []
    for minute, fields in minutes:
        numbers = {k: float(v) for k, v in fields.items() if not k.startswith("vl" + SEP)}
        labels.update({k.split(SEP, 1)[1]: v for k, v in fields.items() if k.startswith("vl" + SEP)})
        per_minute = _numbers(numbers, 60.0)
        rows.append({"t": minute, **{f: per_minute[f] for f in MINUTE}})
        merged.update(numbers)
    span = (minutes[-1][0] - minutes[0][0] + 60.0) if minutes else 0.0
    kind, _, scope_id = window.scope.partition(":")
    return {
        "scope": {"kind": kind, "id": scope_id or None, "since": window.since, "until": window.until},
        "totals": {**_numbers(merged, span), "minutes": len(minutes), "span_s": span},
        "minutes": rows,
        "versions": _versions(merged, labels),
        "kinds": _kinds(merged),
        "stages": _stages(merged),
        "staleness": sorted(
            (
                {"behind": int(k.split(SEP)[1]), "jobs": int(v)}
                for k, v in merged.items()
                if k.startswith("stale" + SEP)
            ),
            key=lambda row: row["behind"],
        ),
        "failures": sorted(
            ({"reason": k.split(SEP, 1)[1], "jobs": int(v)} for k, v in merged.items() if k.startswith("fail" + SEP)),
            key=lambda row: (-row["jobs"], row["reason"]),
        ),
    }


def _numbers(fields: Counter[str] | dict[str, float], seconds: float) -> dict[str, Any]:
    """Jobs by status, reward, tokens, LLM share and sandbox origins of a minute or a whole window."""
    by_status: Counter[str] = Counter()
    reward_sum = rewards = 0.0
    for key, value in fields.items():
        parts = key.split(SEP)
        if parts[0] == "k":
            by_status[parts[2]] += int(value)
        elif parts[0] == "r":
            reward_sum, rewards = (reward_sum + value, rewards) if parts[3] == "s" else (reward_sum, rewards + value)
    generated = int(fields.get("tok|gen", 0))
    pool, started = int(fields.get("sbx|pool", 0)), int(fields.get("sbx|started", 0))
    return {
        "jobs": sum(by_status.values()),
        **{status: by_status[status] for status in STATUSES},
        "rewards": int(rewards),
        "reward_mean": reward_sum / rewards if rewards else None,
        "tokens": int(fields.get("tok|all", 0)),
        "generated_tokens": generated,
        "tokens_per_s": generated / seconds if seconds else None,
        "llm_share": _ratio(fields.get("llm|s", 0.0), fields.get("llm|rollout_s", 0.0)),
        "sandbox_pool": pool,
        "sandbox_started": started,
        "pool_hit_rate": _ratio(pool, pool + started),
    }


def _versions(fields: Counter[str], labels: dict[str, str]) -> list[dict[str, Any]]:
    """Reward per weight version (the one each sample started on), overall and per kind."""
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for key, value in fields.items():
        parts = key.split(SEP)
        if parts[0] == "r":
            sums[parts[1]][parts[2]][0 if parts[3] == "s" else 1] += value
    rows = []
    for seq in sorted(sums, key=lambda s: (s == UNVERSIONED, int(s) if s != UNVERSIONED else 0)):
        total, count = (sum(pair[i] for pair in sums[seq].values()) for i in (0, 1))
        rows.append(
            {
                "seq": None if seq == UNVERSIONED else int(seq),
                "version": labels.get(seq),
                "rewards": int(count),
                "reward_mean": total / count if count else None,
                "by_kind": {kind: s / n if n else None for kind, (s, n) in sorted(sums[seq].items())},
            }
        )
    return rows


def _kinds(fields: Counter[str]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for key, value in fields.items():
        parts = key.split(SEP)
        if parts[0] not in ("k", "r"):
            continue
        row = rows.setdefault(parts[1 if parts[0] == "k" else 2], Counter())
        row[parts[2] if parts[0] == "k" else "reward_" + parts[3]] += value
    return [
        {
            "kind": kind,
            "jobs": int(sum(row[s] for s in STATUSES)),
            **{s: int(row[s]) for s in STATUSES},
            "rewards": int(row["reward_n"]),
            "reward_mean": row["reward_s"] / row["reward_n"] if row["reward_n"] else None,
        }
        for kind, row in sorted(rows.items())
    ]


def _stages(fields: Counter[str]) -> list[dict[str, Any]]:
    """Count, mean, p50 and p90 of each stage time, the percentiles read from the log buckets."""
    rows = []
    for stage in TIMED:
        prefix = f"h{SEP}{stage}{SEP}"
        buckets = {int(k[len(prefix) :]): int(v) for k, v in fields.items() if k.startswith(prefix)}
        count = int(fields.get(f"hn{SEP}{stage}", 0))
        rows.append(
            {
                "stage": stage,
                "count": count,
                "mean_s": fields.get(f"hs{SEP}{stage}", 0.0) / count if count else None,
                "p50_s": quantile(buckets, 0.5),
                "p90_s": quantile(buckets, 0.9),
            }
        )
    return rows


def csv_rows(stats: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """The same numbers as one long table: (section, key, field, value), header first."""
    yield CSV_HEADER
    for section in ("scope", "totals"):
        for field, value in stats[section].items():
            yield section, "", field, value
    for row in stats["minutes"]:
        yield from (("minute", row["t"], f, v) for f, v in row.items() if f != "t")
    for row in stats["versions"]:
        key = UNVERSIONED if row["seq"] is None else row["seq"]
        yield from (("version", key, f, v) for f, v in row.items() if f not in ("seq", "by_kind"))
        yield from (("version", key, f"reward_mean:{kind}", v) for kind, v in row["by_kind"].items())
    for section, key, rows in (("kind", "kind", stats["kinds"]), ("stage", "stage", stats["stages"])):
        for row in rows:
            yield from ((section, row[key], f, v) for f, v in row.items() if f != key)
    yield from (("staleness", row["behind"], "jobs", row["jobs"]) for row in stats["staleness"])
    yield from (("failure", row["reason"], "jobs", row["jobs"]) for row in stats["failures"])


def csv_text(stats: dict[str, Any]) -> str:
    """`csv_rows` as CSV text (an empty cell for a number there is none of)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows(tuple("" if cell is None else cell for cell in row) for row in csv_rows(stats))
    return out.getvalue()


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
