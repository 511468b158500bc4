"""A slot whose rq loop quits on a Redis error is started afresh; a slot whose rq key was lost registers again.

rq's work loop quits on a Redis error it does not retry itself (here: a ConnectionError in its
suspension check, as a Redis outage produced in production), which left live processes with no
slots. These drive that exact error into one slot, without a real outage.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rq import Worker
from rq.worker_registration import clean_worker_registry

from shared.config import Settings
from shared.jobs.queues import stage_queue
from tests.support.waiting import wait_for
from workers.runtime import state as worker_state
from workers.runtime.process import WorkerProcess
from workers.runtime.slots import SlotWorker


@pytest.fixture()
def process(settings: Settings) -> Iterator[WorkerProcess]:
    """A one-slot init process whose slot thread runs; its supervisor loop does not (the test calls it)."""
    saved, worker_state._state = worker_state._state, None
    proc = WorkerProcess("init", settings.model_copy(update={"heartbeat_interval_s": 0.5}), concurrency=1)
    thread = threading.Thread(target=proc._run_slot, args=(0,), daemon=True)
    thread.start()
    yield proc
    proc.stop()
    proc.slots[0].request_slot_stop()
    thread.join(timeout=10)
    worker_state._state.redis.close()
    worker_state._state = saved


def _registered(redis: Redis) -> list[str]:
    return [w.name for w in Worker.all(queue=stage_queue("init", redis))]


def test_a_slot_whose_rq_loop_quits_on_a_redis_error_is_started_afresh(process, redis, monkeypatch):
    first = process.slots[0]
    wait_for(lambda: _registered(redis) == [first.name], what="the slot to register")
    failed = threading.Event()
    check = SlotWorker.check_for_suspension

    def fail_once(self: SlotWorker, burst: bool) -> None:
        if not failed.is_set():
            failed.set()
            raise RedisConnectionError("Connection refused")
        check(self, burst)

    monkeypatch.setattr(SlotWorker, "check_for_suspension", fail_once)
    _enqueue_a_job(redis, "1")  # rq checks for suspension between jobs: after this one
    wait_for(lambda: process.slots[0] is not first, timeout=30, what="a fresh rq worker for the slot")
    assert failed.is_set()
    wait_for(lambda: _registered(redis) == [first.name], timeout=30, what="the fresh slot to register")
    _enqueue_a_job(redis, "2")
    wait_for(lambda: stage_queue("init", redis).count == 0, timeout=30, what="the fresh slot to take a job")


def _enqueue_a_job(redis: Redis, digit: str) -> None:
    """An init rq job for a job id with no record: the stage skips it at once."""
    job_id = digit * 32
    stage_queue("init", redis).enqueue("workers.init.stage.run", job_id, job_id=f"{job_id}-init", result_ttl=0)


def test_a_slot_whose_rq_key_redis_lost_registers_again(process, redis):
    slot = process.slots[0]
    wait_for(lambda: _registered(redis) == [slot.name], what="the slot to register")
    redis.delete(slot.key)  # as if its TTL ran out while Redis was away
    clean_worker_registry(stage_queue("init", redis))
    assert _registered(redis) == []
    slot.ensure_registered()
    assert _registered(redis) == [slot.name]
