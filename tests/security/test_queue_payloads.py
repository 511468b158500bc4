"""A write to a stage queue never becomes code execution in a worker.

rq's default serializer is pickle and an rq job names the function it calls, so anyone who can
write to Redis could run code in every worker. Here forged jobs are pushed straight into every
stage queue of a running stack: a pickle whose unpickling would create a file (in the job's data
and in its meta, which rq unpickles when it fetches a job), and JSON jobs naming `os.system`, as
the function and as the failure callback, and a stage entry point called for a path instead of a
job id (a job's end removes its workspace). None runs; the workers go on with real jobs.
"""

from __future__ import annotations

import json
import pickle
import zlib
from pathlib import Path

import pytest
from redis import Redis

from shared.config import STAGES
from shared.jobs.rq_payloads import ForbiddenJobFunction, StageJob
from tests.support.waiting import client_for, wait_for, wait_status


class _CreatesFileWhenUnpickled:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.path), "w")


def _forge(redis: Redis, stage: str, rq_id: str, fields: dict[str, bytes | str]) -> None:
    """An rq job hash and its queue entry, written as an attacker with Redis access would."""
    created = "2026-01-01T00:00:00.000000Z"
    redis.hset(
        f"rq:job:{rq_id}",
        mapping={"status": "queued", "origin": stage, "created_at": created, "description": "forged", **fields},
    )
    redis.rpush(f"rq:queue:{stage}", rq_id)


def test_a_pickled_payload_or_a_forged_function_runs_nothing(make_stack, trace_dir, tmp_path):
    stack = make_stack()
    api = client_for(stack)
    redis = Redis.from_url(stack.redis_url)
    planted: list[Path] = []
    forged: list[tuple[str, str]] = []
    for stage in STAGES:
        for where in ("data", "data-compressed", "meta"):
            target = tmp_path / f"unpickled-{stage}-{where}"
            planted.append(target)
            payload = pickle.dumps(_CreatesFileWhenUnpickled(target))
            ok_data = json.dumps(["workers.init.stage.run", None, ["0" * 32], {}])
            fields = {
                "data": {"data": payload, "data-compressed": zlib.compress(payload)}.get(where, ok_data.encode()),
                **({"meta": payload} if where == "meta" else {}),
            }
            forged.append((stage, f"pickle-{stage}-{where}"))
            _forge(redis, stage, forged[-1][1], fields)
        command = f"touch {tmp_path / f'os-system-{stage}'}"
        planted += [tmp_path / f"os-system-{stage}", tmp_path / f"os-system-callback-{stage}"]
        forged.append((stage, f"system-{stage}"))
        _forge(redis, stage, forged[-1][1], {"data": json.dumps(["os.system", None, [command], {}])})
        # A stage entry point may be named, but only for a job id: never for a path to remove.
        victim = tmp_path / f"victim-{stage}"
        victim.mkdir()
        planted.append(victim)
        forged.append((stage, f"path-{stage}"))
        path_as_job_id = json.dumps([f"workers.{stage}.stage.run", None, [str(victim)], {}])
        _forge(redis, stage, forged[-1][1], {"data": path_as_job_id})
        forged.append((stage, f"callback-{stage}"))
        _forge(
            redis,
            stage,
            forged[-1][1],
            {
                "data": json.dumps(["workers.init.stage.run", None, ["0" * 32], {}]),
                "failure_callback_name": "os.system",
            },
        )

    # Every forged job is taken off its queue, and a real job still goes through every stage after them.
    wait_for(
        lambda: all(redis.llen(f"rq:queue:{stage}") == 0 for stage in STAGES),
        timeout=60,
        what="the forged jobs to be dequeued",
    )
    job_id = api.post("/v1/jobs", json={"task": {"kind": "scripted", "trace": str(trace_dir)}}).json()["job_ids"][0]
    assert wait_status(api, job_id)["status"] == "done"

    assert [path for path in planted if path.exists() != path.name.startswith("victim")] == []
    assert all(process.poll() is None for procs in stack.workers.values() for process in procs)


def test_stage_job_calls_only_stage_entry_points(redis):
    job = StageJob.create("os.system", args=["true"], connection=redis)
    with pytest.raises(ForbiddenJobFunction):
        job.func  # noqa: B018 - the property is the check
    assert StageJob.create("workers.eval.stage.run", args=["x"], connection=redis).func.__name__ == "run"
