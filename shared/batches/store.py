"""Batch state in Redis: create, reserve and launch groups, record finished jobs, close, read.

Nothing about a batch lives in a process's memory. The prompts, the cursor, the
counters and the groups are Redis keys; each decision (which prompt runs next,
whether a group is informative, whether the target is met) is one Lua script,
so any process that sees a job end (a stage worker, the API's cancel, the
sweep) can take it, and a crash between a decision and the job submission it
implies is repaired by re-submitting under the same idempotency keys.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from redis import Redis

from shared.batches.spec import BatchRequest, group_id, idempotency_key
from shared.batches.status import BatchStatus
from shared.codec import pack, unpack
from shared.errors import StoredResultError
from shared.jobs.record_fields import output_field
from shared.jobs.status import JobStatus
from shared.jobs.store import JobStore
from shared.keys import BatchKeys
from shared.lua_scripts import register_lua

_COUNTERS = (
    "cursor",
    "launched",
    "in_flight",
    "completed",
    "used",
    "informative",
    "uniform",
    "failed",
    "late",
    "stale",
)


@dataclass(frozen=True)
class Recorded:
    """What recording one finished job decided."""

    recorded: bool
    group_complete: bool = False
    outcome: str = ""  # informative, uniform or failed, when the group completed
    batch_status: str = ""
    reserved: tuple[int, ...] = ()  # prompt indices to launch now
    late: bool = False  # the batch had closed before this group completed

    @property
    def closed_batch(self) -> bool:
        """This group's completion closed the batch (target met or prompts ran out)."""
        return self.group_complete and not self.late and self.batch_status != BatchStatus.RUNNING


class BatchStore:
    def __init__(self, jobs: JobStore) -> None:
        self.jobs = jobs
        self.redis: Redis = jobs.redis
        self.settings = jobs.settings
        self.keys = BatchKeys(jobs.keys.prefix)
        # reserve.lua holds the helpers the three share
        self._fill = register_lua(self.redis, __package__, "reserve.lua", "fill.lua")
        self._record = register_lua(self.redis, __package__, "reserve.lua", "record.lua")
        self._close = register_lua(self.redis, __package__, "reserve.lua", "close.lua")

    @property
    def ttl(self) -> int:
        """Batch keys live as long as finished job records do, counted from creation."""
        return int(self.settings.job_ttl_s + self.settings.default_total_timeout_s)

    # --- create and launch --------------------------------------------------------
    def groups_in_flight(self, request: BatchRequest, target: int) -> int:
        """The in-flight level: the request's, capped by the settings' maximum; by default the
        settings' default or the target, whichever is less (a batch of 1M prompts must not reserve
        1M groups and submit 1M x n jobs at once)."""
        if request.max_groups_in_flight is not None:
            return max(1, min(request.max_groups_in_flight, self.settings.batch_max_groups_in_flight))
        settings = self.settings
        return max(1, min(target, settings.batch_default_groups_in_flight, settings.batch_max_groups_in_flight))

    def create(self, request: BatchRequest, prompts: list[dict[str, Any]]) -> str:
        """Store the batch and its prompts (replenish.start_batch then launches the first groups)."""
        batch_id = secrets.token_hex(8)
        target = request.min_informative_groups or len(prompts)
        max_in_flight = self.groups_in_flight(request, target)
        settings = request.model_dump(mode="json", exclude={"prompts"})
        now = time.time()
        fields: dict[str, Any] = {
            "id": batch_id,
            "status": BatchStatus.RUNNING.value,
            "mode": request.mode,
            "n": request.n_samples,
            "pool_size": len(prompts),
            "target": target,
            "max_in_flight": max_in_flight,
            "on_target": request.on_target,
            "advantages": request.advantages,
            "epsilon": repr(request.reward_epsilon),
            "created_at": repr(now),
            "request": pack(settings),
            **{name: 0 for name in _COUNTERS},
        }
        keys = [self.keys.batch(batch_id), self.keys.batch_prompts(batch_id)]
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys[0], mapping=fields)
            for start in range(0, len(prompts), 1000):
                pipe.rpush(keys[1], *[pack(item) for item in prompts[start : start + 1000]])
            pipe.xadd(self.keys.stream(batch_id), {"type": "start"})
            for key in (*keys, self.keys.stream(batch_id)):
                pipe.expire(key, self.ttl)
            pipe.zadd(self.keys.batches, {batch_id: now})
            pipe.sadd(self.keys.live, batch_id)
            pipe.execute()
        return batch_id

    def fill(self, batch_id: str) -> list[int]:
        """Reserve groups up to the in-flight level (a new batch; the sweep after a lost reservation)."""
        reply = self._fill(
            keys=[self.keys.batch(batch_id), self.keys.inflight(batch_id), self.keys.launching(batch_id)],
            args=[self.keys.group_prefix(batch_id), repr(time.time()), self.ttl],
        )
        return [int(k) for k in reply]

    def submit_groups(self, batch_id: str, prompt_indices: list[int]) -> None:
        """Submit the jobs of reserved groups. Safe to repeat: the idempotency keys map to the same jobs."""
        if not prompt_indices:
            return
        n_raw, request_raw = self.redis.hmget(self.keys.batch(batch_id), ("n", "request"))
        if n_raw is None:
            return
        n, request = int(n_raw), unpack(request_raw)
        with self.redis.pipeline(transaction=False) as pipe:
            for k in prompt_indices:
                pipe.lindex(self.keys.batch_prompts(batch_id), k)
            items = [unpack(raw) for raw in pipe.execute()]
        specs = [
            self._job_spec(batch_id, request, k, item, i)
            for k, item in zip(prompt_indices, items)
            if item is not None
            for i in range(n)
        ]
        if specs:
            self.jobs.submit(specs)
        self.redis.zrem(self.keys.launching(batch_id), *prompt_indices)

    @staticmethod
    def _job_spec(batch_id: str, request: dict[str, Any], k: int, item: dict[str, Any], i: int) -> dict[str, Any]:
        return {
            "task": item["task"],
            "sampling": item.get("sampling") or request["sampling"],
            "limits": item.get("limits") or request["limits"],
            "group_id": group_id(batch_id, k),
            "sample_index": i,
            "idempotency_key": idempotency_key(batch_id, k, i),
            "metadata": {**(item.get("metadata") or {}), "batch_id": batch_id, "prompt_index": k},
        }

    # --- record and close ---------------------------------------------------------
    def record(
        self, batch_id: str, k: int, sample: int, job_id: str, status: str, reward: float | None, error: str = ""
    ) -> Recorded:
        reply = self._record(
            keys=[
                self.keys.batch(batch_id),
                self.keys.group(batch_id, k),
                self.keys.inflight(batch_id),
                self.keys.launching(batch_id),
                self.keys.stream(batch_id),
                self.keys.live,
            ],
            args=[
                self.keys.group_prefix(batch_id),
                k,
                sample,
                job_id,
                status,
                "" if reward is None else repr(float(reward)),
                repr(time.time()),
                self.ttl,
                batch_id,
                error,
            ],
        )
        if reply[0] == 0:
            return Recorded(recorded=False)
        if reply[0] == 1:
            return Recorded(recorded=True)
        return Recorded(
            recorded=True,
            group_complete=True,
            outcome=_text(reply[1]),
            batch_status=_text(reply[2]),
            reserved=tuple(int(x) for x in reply[3]),
            late=bool(reply[4]),
        )

    def close(
        self, batch_id: str, status: str = BatchStatus.CANCELLED, reason: str = "cancelled by request"
    ) -> tuple[bool, str]:
        """(closed now, the status before or the status that refused); ("", False) when no such batch."""
        reply = self._close(
            keys=[self.keys.batch(batch_id), self.keys.stream(batch_id)], args=[status, reason, repr(time.time())]
        )
        return bool(reply[0]), _text(reply[1])

    # --- read ---------------------------------------------------------------------
    def head(self, batch_id: str) -> dict[str, Any] | None:
        """The batch hash decoded: counters as ints, times as floats, the request unpacked."""
        raw = self.redis.hgetall(self.keys.batch(batch_id))
        return decode_batch(raw) if raw else None

    def in_flight_groups(self, batch_id: str) -> list[int]:
        return sorted(int(k) for k in self.redis.smembers(self.keys.inflight(batch_id)))

    def group_job_ids(self, batch_id: str, k: int) -> list[str]:
        return self.jobs.list_page(group_id=group_id(batch_id, k), limit=10_000)[0]

    def group(self, batch_id: str, k: int) -> dict[str, Any]:
        return decode_group(self.redis.hgetall(self.keys.group(batch_id, k)))

    def groups(self, batch_id: str, indices: list[int]) -> list[dict[str, Any]]:
        with self.redis.pipeline(transaction=False) as pipe:
            for k in indices:
                pipe.hgetall(self.keys.group(batch_id, k))
            return [decode_group(raw) for raw in pipe.execute()]

    def prompts(self, batch_id: str, indices: list[int]) -> list[dict[str, Any] | None]:
        with self.redis.pipeline(transaction=False) as pipe:
            for k in indices:
                pipe.lindex(self.keys.batch_prompts(batch_id), k)
            return [unpack(raw) for raw in pipe.execute()]


def closes_groups(head: dict[str, Any]) -> bool:
    """Groups still running must stop: the batch was cancelled, or closed with on_target=cancel."""
    status = head["status"]
    return status == BatchStatus.CANCELLED or (
        status in (BatchStatus.COMPLETED, BatchStatus.EXHAUSTED) and head["on_target"] == "cancel"
    )


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def decode_batch(raw: dict[bytes, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name_raw, value_raw in raw.items():
        name = name_raw.decode()
        if name == "request":
            out[name] = unpack(value_raw)
        elif name in _COUNTERS or name in ("n", "pool_size", "target", "max_in_flight"):
            out[name] = int(value_raw)
        elif name in ("created_at", "finished_at", "epsilon"):
            out[name] = float(value_raw)
        else:
            out[name] = value_raw.decode()
    return out


def decode_group(raw: dict[bytes, bytes]) -> dict[str, Any]:
    """{outcome, used, launched_at, completed_at, error, samples: {i: {status, reward, job_id}}}."""
    group: dict[str, Any] = {"samples": {}}
    for name_raw, value_raw in raw.items():
        name, value = name_raw.decode(), value_raw.decode()
        kind, _, index = name.partition(":")
        if index and kind in ("s", "r", "j"):
            sample = group["samples"].setdefault(int(index), {})
            if kind == "s":
                sample["status"] = value
            elif kind == "r":
                sample["reward"] = float(value) if value else None
            else:
                sample["job_id"] = value
        elif name in ("launched_at", "completed_at"):
            group[name] = float(value)
        elif name in ("used", "late", "recorded"):
            group[name] = int(value)
        else:
            group[name] = value
    return group


def group_views(
    batches: BatchStore, batch_id: str, indices: list[int], with_results: bool = False
) -> list[dict[str, Any]]:
    """The public view of these completed groups; `with_results` embeds each sample's trajectory and evaluation.

    A sample whose stored result cannot be read has `result` None and `result_error` naming the
    job and the file, so one lost file does not break a page or a stream of a whole batch.
    """
    from shared.batches.views import group_view

    head = batches.head(batch_id)
    if head is None or not indices:
        return []
    groups = batches.groups(batch_id, indices)
    prompts = batches.prompts(batch_id, indices)
    results: dict[str, dict[str, Any] | None] | None = None
    errors: dict[str, str] = {}
    if with_results:
        job_ids = [s["job_id"] for g in groups for s in g["samples"].values() if s.get("job_id")]
        results = {}
        for job_id, record in zip(job_ids, batches.jobs.get_many(job_ids)):
            try:
                results[job_id] = _result(batches.jobs, record)
            except StoredResultError as exc:
                results[job_id], errors[job_id] = None, str(exc)
    return [group_view(head, k, g, p, results, errors) for k, g, p in zip(indices, groups, prompts)]


def _result(jobs: JobStore, record: dict[str, Any] | None) -> dict[str, Any] | None:
    """What GET /v1/jobs/{id} calls `result`: the trajectory and the evaluation of a done job."""
    if record is None or record.get("status") != JobStatus.DONE:
        return None
    record = jobs.with_outputs(record)
    evaluation = record.get(output_field("eval")) or {}
    trajectory = record.get(output_field("rollout")) or {}
    return {"reward": evaluation.get("reward"), "trajectory": trajectory, "evaluation": evaluation}
