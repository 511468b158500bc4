"""The job record in Redis: create, read, list, move between statuses, cancel.

A record is one hash. Small scalar fields (status, timestamps, counters) are
plain hash fields so a stage can update its timing without rewriting the
record; the request spec, stage outputs, result and error are msgpack blobs.
Every status change goes through one Lua script (transition.lua), so a cancel
racing a stage hand-over has exactly one winner, and the per-status indexes
used for listing never disagree with the records.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import RedisError

from shared.codec import pack, unpack
from shared.config import Settings
from shared.errors import ValidationError
from shared.jobs.queues import enqueue_stage
from shared.jobs.record_fields import (
    OUTPUT_FIELDS,
    ROLLOUT_SUMMARY,
    attempts_field,
    output_field,
    ref_field,
    time_field,
)
from shared.jobs.spec import Limits
from shared.jobs.status import ALL_STATUSES, TERMINAL, JobStatus
from shared.keys import Keys
from shared.lua_scripts import register_lua
from shared.results import ResultStore

_BLOB_FIELDS = ("spec", "result", "error", "partial", "reward", ROLLOUT_SUMMARY, *OUTPUT_FIELDS)
# The large parts of a job, kept in the results store; the record holds `ref:<part>` to each.
STORED_PARTS = ("rollout", "eval", "partial")


def encode_cursor(job_id: str, score: float) -> str:
    """A page cursor: the last job of the page and its place in time, opaque to clients."""
    return f"{score!r}_{job_id}"


def decode_cursor(cursor: str) -> tuple[str, float]:
    """(job id, score) of a cursor; ValidationError at query.cursor when it is not one of ours."""
    score, _, job_id = cursor.partition("_")
    try:
        value = float(score)
    except ValueError:
        value = float("nan")
    if (
        not job_id
        or not job_id.isalnum()
        or len(job_id) > 64
        or value != value
        or value in (float("inf"), float("-inf"))
    ):
        raise ValidationError("not a cursor from an earlier page (next_cursor)", ("query", "cursor"))
    return job_id, value


def new_job_id() -> str:
    """128 random bits: not guessable, not sequential, valid as an rq job id."""
    return secrets.token_hex(16)


class IdempotencyConflict(ValidationError):
    """An idempotency key already names a job with a different request: retrying is not re-asking.

    The store raises it at (index in the submitted list, "idempotency_key"); the API answers 409."""

    def __init__(self, key: str, job_id: str, loc: tuple[str | int, ...]) -> None:
        self.key = key
        self.job_id = job_id
        super().__init__(f"idempotency key {key!r} is held by job {job_id} with a different request", loc)


@dataclass(frozen=True)
class Submitted:
    job_id: str
    created: bool  # False when an idempotency key matched an existing job


@dataclass(frozen=True)
class Transition:
    applied: bool
    previous: str  # the status before (applied) or the status that refused the move ("" = no such job)


@dataclass(frozen=True)
class Taken:
    applied: bool
    previous: str  # as for Transition
    attempt: int = 0  # the attempt's number at this stage: its fencing token
    record: dict[str, Any] | None = None  # the record as the attempt starts from it


class JobStore:
    """All reads and writes of job records; the API and the workers share it."""

    def __init__(self, redis: Redis, settings: Settings, keys: Keys | None = None) -> None:
        self.redis = redis
        self.settings = settings
        self.keys = keys or Keys(settings.redis_prefix)
        self.results = ResultStore(
            settings.results, settings.results_min_free_bytes, settings.results_compression_level
        )
        if settings.results_root is None:
            self.results.ensure_root()  # the embedded default; a configured (shared) path must exist
        self._transition = register_lua(redis, __package__, "transition.lua")
        self._take = register_lua(redis, __package__, "take.lua")

    # --- create -----------------------------------------------------------
    def submit(self, specs: list[dict[str, Any]]) -> list[Submitted]:
        """Store the jobs and queue them on `init`, all in one transaction.

        Jobs whose idempotency key is already taken are answered with the job
        that holds it; a repeated key inside one request maps to one job.
        """
        ids: list[str | None] = [None] * len(specs)
        created = [True] * len(specs)
        self._claim_idempotency_keys(specs, ids, created)

        now = time.time()
        new_jobs: list[tuple[str, dict[str, Any]]] = []
        seen: set[str] = set()
        for index, spec in enumerate(specs):
            job_id = ids[index] or new_job_id()
            ids[index] = job_id
            if created[index] and job_id not in seen:
                seen.add(job_id)
                new_jobs.append((job_id, spec))

        if new_jobs:
            with self.redis.pipeline(transaction=True) as pipe:
                for job_id, spec in new_jobs:
                    self._write_new_record(pipe, job_id, spec, now)
                limits = [(job_id, Limits.model_validate(spec.get("limits") or {})) for job_id, spec in new_jobs]
                enqueue_stage(pipe, "init", limits, self.settings, self.redis)
                pipe.execute()
        return [Submitted(job_id=i, created=c) for i, c in zip(ids, created)]  # type: ignore[arg-type]

    def _claim_idempotency_keys(self, specs: list[dict[str, Any]], ids: list[str | None], created: list[bool]) -> None:
        keyed = [(i, s["idempotency_key"]) for i, s in enumerate(specs) if s.get("idempotency_key")]
        if not keyed:
            return
        first_index: dict[str, int] = {}
        candidates: dict[str, str] = {}
        for index, key in keyed:
            if key in first_index:
                continue
            first_index[key] = index
            candidates[key] = new_job_id()
        with self.redis.pipeline(transaction=False) as pipe:
            for key, job_id in candidates.items():
                pipe.set(self.keys.idempotency(key), job_id, nx=True, ex=self.settings.job_ttl_s)
                pipe.get(self.keys.idempotency(key))
            replies = pipe.execute()
        holders = {key: replies[2 * n + 1].decode() for n, key in enumerate(candidates)}
        taken = {key for key, job_id in candidates.items() if holders[key] != job_id}
        held_specs: dict[str, bytes | None] = {}
        # A key can be held by a job whose record was never written (the API died
        # between the two round trips): such a job is created now under that id.
        if taken:
            with self.redis.pipeline(transaction=False) as pipe:
                for key in taken:
                    pipe.hget(self.keys.job(holders[key]), "spec")
                held_specs = dict(zip(taken, pipe.execute()))
        for index, key in keyed:
            first = first_index[key]
            held = held_specs.get(key)
            if specs[index] != (specs[first] if held is None else unpack(held)):
                raise IdempotencyConflict(key, holders[key], (index, "idempotency_key"))
            ids[index] = holders[key]
            created[index] = first == index and held is None

    def _write_new_record(self, pipe: Any, job_id: str, spec: dict[str, Any], now: float) -> None:
        record: dict[str, Any] = {
            "id": job_id,
            "status": JobStatus.QUEUED,
            "kind": spec["task"]["kind"],
            "created_at": now,
            "updated_at": now,
            time_field("init", "queued"): now,
            "spec": pack(spec),
        }
        if spec.get("group_id"):
            record["group_id"] = spec["group_id"]
        if spec.get("sample_index") is not None:
            record["sample_index"] = spec["sample_index"]
        pipe.hset(self.keys.job(job_id), mapping=record)
        pipe.zadd(self.keys.jobs_all, {job_id: now})
        pipe.zadd(self.keys.jobs_by_status(JobStatus.QUEUED), {job_id: now})
        if spec.get("group_id"):
            pipe.zadd(self.keys.jobs_by_group(spec["group_id"]), {job_id: spec.get("sample_index") or 0})
            pipe.expire(self.keys.jobs_by_group(spec["group_id"]), self.settings.job_ttl_s)

    # --- read -------------------------------------------------------------
    def get(self, job_id: str) -> dict[str, Any] | None:
        """The full record with blobs decoded, or None."""
        raw = self.redis.hgetall(self.keys.job(job_id))
        return decode_record(raw) if raw else None

    def get_many(self, job_ids: list[str]) -> list[dict[str, Any] | None]:
        with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hgetall(self.keys.job(job_id))
            raws = pipe.execute()
        return [decode_record(raw) if raw else None for raw in raws]

    def status(self, job_id: str) -> str | None:
        value = self.redis.hget(self.keys.job(job_id), "status")
        return value.decode() if value else None

    def list_page(
        self,
        status: str | None = None,
        group_id: str | None = None,
        limit: int = 100,
        *,
        offset: int = 0,
        after: str | None = None,
    ) -> tuple[list[str], str | None]:
        """A page of ids, newest first (by group: in sample order; entries whose record expired are
        dropped), and the cursor of the next one (None after the last page).

        `after` is a cursor from an earlier page: the page starts right after the job it names,
        wherever that job is now, so jobs submitted meanwhile neither repeat nor push others off a
        page as they do with `offset`. A cursor whose job has left the index (its status moved on,
        its record expired) continues from the job's position in time.
        """
        if group_id:
            index, reverse = self.keys.jobs_by_group(group_id), False
        elif status:
            index, reverse = self.keys.jobs_by_status(status), True
        else:
            index, reverse = self.keys.jobs_all, True
        start = offset if after is None else self._position_after(index, after, reverse)
        fetch = self.redis.zrevrange if reverse else self.redis.zrange
        rows = fetch(index, start, start + limit, withscores=True)  # one more than the page: is there a next?
        page = [(member.decode(), score) for member, score in rows[:limit]]
        next_cursor = encode_cursor(*page[-1]) if len(rows) > limit else None
        ids = [job_id for job_id, _ in page]
        if group_id and status:
            statuses = self.statuses(ids)
            ids = [i for i, s in zip(ids, statuses) if s == status]
        return ids, next_cursor

    def _position_after(self, index: str, cursor: str, reverse: bool) -> int:
        """Where the page after `cursor` starts in `index` (a rank)."""
        job_id, score = decode_cursor(cursor)
        rank = (self.redis.zrevrank if reverse else self.redis.zrank)(index, job_id)
        if rank is not None:
            return rank + 1
        # Gone from the index: count what sorts before it (by score, then by id, as Redis orders ties).
        if reverse:
            newer = self.redis.zcount(index, f"({score!r}", "+inf")
            ties = [m.decode() for m in self.redis.zrangebyscore(index, score, score)]
            return newer + sum(1 for member in ties if member > job_id)
        older = self.redis.zcount(index, "-inf", f"({score!r}")
        ties = [m.decode() for m in self.redis.zrangebyscore(index, score, score)]
        return older + sum(1 for member in ties if member < job_id)

    def statuses(self, job_ids: list[str]) -> list[str | None]:
        with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(self.keys.job(job_id), "status")
            return [v.decode() if v else None for v in pipe.execute()]

    def running_state(self, running: list[tuple[str, str]]) -> list[tuple[str | None, int | None]]:
        """(status, attempt count of the stage) for each (job id, stage); what a supervisor checks."""
        with self.redis.pipeline(transaction=False) as pipe:
            for job_id, stage in running:
                pipe.hmget(self.keys.job(job_id), ("status", attempts_field(stage)))
            rows = pipe.execute()
        return [(_text(s) or None, int(a) if a is not None else None) for s, a in rows]

    def counts_by_status(self) -> dict[str, int]:
        with self.redis.pipeline(transaction=False) as pipe:
            for status in ALL_STATUSES:
                pipe.zcard(self.keys.jobs_by_status(status))
            return dict(zip(ALL_STATUSES, pipe.execute()))

    # --- stored results ---------------------------------------------------
    def store_part(self, job_id: str, part: str, value: Any, attempt: int | None = None) -> dict[str, Any]:
        """Write one large part to the results store; returns the record field that refers to it.
        A stage attempt passes its number (its fencing token): its file is its own, so a superseded
        attempt finishing late never replaces the file of the attempt whose record write won.

        Raises ResultsUnavailable (naming the path) when the store cannot take it.
        """
        ref, size = self.results.put(job_id, part, value, attempt=attempt)
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.hincrby(self.keys.results_usage, "bytes", size)
                pipe.hincrby(self.keys.results_usage, "files", 1)
                pipe.execute()
        except RedisError:  # the usage gauge is advisory; the result itself is safe on disk
            pass
        return {ref_field(part): ref}

    def with_outputs(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with each stored part read back in place (`out:<stage>`, `partial`).

        Raises StoredResultGone or StoredResultCorrupt naming the job and the file.
        """
        for part, ref in record.get("refs", {}).items():
            field = "partial" if part == "partial" else output_field(part)
            record[field] = self.results.get(record["id"], part, ref)
        return record

    def results_usage(self) -> dict[str, int]:
        """Bytes and files in the results store, as counted by writes and sweeps."""
        raw = self.redis.hgetall(self.keys.results_usage)
        return {"bytes": int(raw.get(b"bytes", 0)), "files": int(raw.get(b"files", 0))}

    # --- write ------------------------------------------------------------
    def transition(
        self,
        job_id: str,
        allowed_from: tuple[str, ...] | str,
        new_status: str,
        fields: dict[str, Any] | None = None,
        guard: tuple[str, Any] | None = None,
    ) -> Transition:
        """Atomically move a job from one of `allowed_from` ("*" = any live status) to `new_status`.

        `guard=(field, value)` also requires that field to hold that value: a stage attempt
        passes its fencing token so a superseded attempt can never move the job on.
        """
        applied, previous = self._transition(
            keys=[self.keys.job(job_id)], args=self._transition_args(job_id, allowed_from, new_status, fields, guard)
        )
        return Transition(applied=bool(applied), previous=_text(previous))

    def take(self, job_id: str, stage: str, allowed_from: tuple[str, ...], worker: str) -> Taken:
        """Move a job into `stage` for a new attempt and return its record, in one round trip."""
        reply = self._take(
            keys=[self.keys.job(job_id)],
            args=[
                self.keys.status_index_prefix,
                job_id,
                ",".join(allowed_from),
                stage,
                repr(time.time()),
                worker,
            ],
        )
        if not reply[0]:
            return Taken(applied=False, previous=_text(reply[1]))
        flat = reply[3:]
        record = decode_record(dict(zip(flat[::2], flat[1::2])))
        return Taken(applied=True, previous=_text(reply[1]), attempt=int(reply[2]), record=record)

    def queue_transition(
        self,
        pipe: Pipeline,
        job_id: str,
        allowed_from: tuple[str, ...] | str,
        new_status: str,
        fields: dict[str, Any] | None = None,
        guard: tuple[str, Any] | None = None,
    ) -> None:
        """The same move, queued in the caller's transaction; its reply is [applied, previous]."""
        self._transition(
            keys=[self.keys.job(job_id)],
            args=self._transition_args(job_id, allowed_from, new_status, fields, guard),
            client=pipe,
        )

    def _transition_args(
        self,
        job_id: str,
        allowed_from: tuple[str, ...] | str,
        new_status: str,
        fields: dict[str, Any] | None,
        guard: tuple[str, Any] | None = None,
    ) -> list[Any]:
        now = time.time()
        args: list[Any] = [
            self.keys.status_index_prefix,
            job_id,
            allowed_from if isinstance(allowed_from, str) else ",".join(allowed_from),
            new_status,
            repr(now),
            self.settings.job_ttl_s if new_status in TERMINAL else 0,
            self._channel_for(new_status),
            guard[0] if guard else "",
            str(guard[1]) if guard else "",
        ]
        for name, value in (fields or {}).items():
            args.extend((name, _encode_field(name, value)))
        if new_status in TERMINAL:
            args.extend(("finished_at", repr(now)))
        return args

    def _channel_for(self, new_status: str) -> str:
        """Where a move is published: cancels where running workers hear them at once; the other ends where
        only the API's long polls listen (a PUBLISH on the workers' channel wakes every worker process)."""
        if new_status == JobStatus.CANCELLED:
            return self.keys.job_events
        return self.keys.job_ends if new_status in TERMINAL else ""

    def set_fields(self, job_id: str, fields: dict[str, Any]) -> None:
        """Set fields of a live record without touching its status (timings, partial output)."""
        mapping = {name: _encode_field(name, value) for name, value in fields.items()}
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.exists(self.keys.job(job_id))
            pipe.hset(self.keys.job(job_id), mapping=mapping)
            exists, _ = pipe.execute()
        if not exists:  # the record expired or was never there: don't leave a stub hash behind
            self.redis.delete(self.keys.job(job_id))

    def cancel(self, job_id: str) -> Transition:
        """Cancel a live job. Queued work is skipped by the worker that dequeues it; running work
        is stopped by its worker, which watches the events channel."""
        error = {"type": "cancelled", "message": "cancelled by request"}
        return self.transition(job_id, "*", JobStatus.CANCELLED, {"error": error})

    def trim_indexes(self) -> int:
        """Drop index entries of records that have expired (terminal for longer than job_ttl_s)."""
        cutoff = time.time() - self.settings.job_ttl_s
        removed = 0
        with self.redis.pipeline(transaction=False) as pipe:
            for status in TERMINAL:
                pipe.zremrangebyscore(self.keys.jobs_by_status(status), 0, cutoff)
            pipe.zremrangebyscore(self.keys.jobs_all, 0, cutoff - self.settings.default_total_timeout_s)
            removed = sum(pipe.execute())
        return removed


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def _encode_field(name: str, value: Any) -> Any:
    if name in _BLOB_FIELDS:
        return pack(value)
    if isinstance(value, float):
        return repr(value)
    return value


def reward_of(reward: bytes | None, evaluation: bytes | None) -> Any:
    """A done job's reward from its raw `reward` field (or, in records written before the results
    store, its `out:eval` blob)."""
    if reward is not None:
        return unpack(reward)
    return (unpack(evaluation) or {}).get("reward")


def decode_record(raw: dict[bytes, bytes]) -> dict[str, Any]:
    """Turn a raw job hash into a plain dict: blobs unpacked, numbers parsed, per-stage fields nested."""
    record: dict[str, Any] = {
        "timings": {},
        "attempts": {},
        "workers": {},
        "lost": {},
        "refs": {},
        "wait": {},
        "failovers": {},
        "sandboxes": {},
    }
    for raw_name, raw_value in raw.items():
        name = raw_name.decode()
        if name in _BLOB_FIELDS:
            record[name] = unpack(raw_value)
            continue
        value = raw_value.decode()
        group, _, rest = name.partition(":")
        if group == "t":
            stage, _, event = rest.partition(":")
            record["timings"].setdefault(stage, {})[event] = float(value)
        elif group in ("attempts", "lost", "wait", "failovers"):
            record[group][rest] = int(value)
        elif group == "worker":
            record["workers"][rest] = value
        elif group == "sandbox":
            stage, _, attempt = rest.partition(":")
            record["sandboxes"].setdefault(stage, {})[attempt] = value
        elif group == "ref":
            record["refs"][rest] = value
        elif name in ("created_at", "updated_at", "finished_at"):
            record[name] = float(value)
        elif name == "sample_index":
            record[name] = int(value)
        else:
            record[name] = value
    return record
