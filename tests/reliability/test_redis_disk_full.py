"""The embedded Redis' own disk fills mid-run: its AOF writes fail and it refuses writes (MISCONF).

A size-capped tmpfs is mounted over `<state_dir>/redis` (the embedded Redis' `--dir`, `appendonly yes`
as `rollouts up`), and once jobs are in every stage a filler file takes all of its space. Redis
7 then answers every write with "MISCONF Errors writing to the AOF file: No space left on device"
and still serves reads. Needs root (to mount); skipped otherwise. The mount is always undone.

Checked, with jobs in every stage when the disk fills:
- the API refuses new submissions with a 503 naming the cause (not a 500, not a 202 for work Redis
  cannot keep), while reads (GET /v1/jobs) still answer;
- no job is failed for it: the workers hold each stage's result and write it once Redis takes
  writes again (infrastructure trouble is never a failed job, never a reward);
- the filler is removed and, with no restart, every accepted job ends `done` once with its reward,
  none lost, and new submissions are accepted again. How soon is reported, not asserted.

Fill length: ROLLOUTS_REDIS_DISK_FULL_S (default 10 s).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

from cli.stack import Stack
from shared.config import STAGES
from shared.redis_conn import write_refusal
from tests.reliability.jobs import scripted_jobs, statuses, wait_all_terminal
from tests.reliability.outage_stack import SLEEP, every_second_for, submit_until_accepted
from tests.support.small_disk import small_tmpfs
from tests.support.waiting import client_for, trace, wait_for

DISK_BYTES = 8 * 1024 * 1024
FULL_S = float(os.environ.get("ROLLOUTS_REDIS_DISK_FULL_S", "10"))
FIRST_WAVE = 24
SECOND_WAVE = 8
ENOSPC = "No space left on device"


@pytest.fixture()
def redis_disk(tmp_path: Path) -> Iterator[Path]:
    """`<state_dir>/redis` on its own small tmpfs, mounted before the stack starts (persistent_stack's
    state dir is tmp_path/state); unmounted after the stack stops."""
    with small_tmpfs(tmp_path / "state" / "redis", DISK_BYTES) as redis_dir:
        yield redis_dir


@pytest.fixture()
def stack(redis_disk: Path, request: pytest.FixtureRequest) -> Stack:
    """persistent_stack, started only once the small disk is mounted (so stopped before it goes)."""
    started: Stack = request.getfixturevalue("persistent_stack")
    assert started.redis is not None and started.redis.data_dir == redis_disk
    assert os.stat(redis_disk).st_dev != os.stat(started.settings.state_dir).st_dev
    return started


def fill(directory: Path) -> Path:
    """A file that takes every free block of `directory`'s filesystem; returns its path."""
    filler = directory / "filler"
    chunk = b"\0" * (64 * 1024)
    with open(filler, "wb", buffering=0) as out:
        while True:
            try:
                out.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    small = b"\0" * 512
    with open(filler, "ab", buffering=0) as out:  # the last partial page
        while os.statvfs(directory).f_bavail:
            try:
                out.write(small)
            except OSError:
                break
    return filler


def post(api: httpx.Client, key: str) -> httpx.Response:
    """One scripted job, as a probe of whether the API takes work."""
    job = {**scripted_jobs(1, None, SLEEP)[0], "idempotency_key": key}
    return api.post("/v1/jobs", json=[job])


def test_redis_disk_full_refuses_submissions_and_loses_no_job(
    stack: Stack, redis_disk: Path, trace_dir: Path, figure
) -> None:
    api = client_for(stack)
    pids = {stage: [p.pid for p in stack.workers[stage]] for stage in STAGES}
    accepted = submit_until_accepted(api, scripted_jobs(FIRST_WAVE, trace_dir, SLEEP))
    wait_for(lambda: sum(s == "done" for s in statuses(api, accepted).values()) >= 1, what="a first job done")

    filler = fill(redis_disk)
    filled = time.monotonic()
    probes: list[httpx.Response] = []

    def refused() -> httpx.Response | None:
        response = post(api, f"probe-{len(probes)}")
        probes.append(response)
        if response.status_code == 202:
            accepted.extend(response.json()["job_ids"])  # taken before Redis noticed: it must be kept
            return None
        return response

    first_503 = wait_for(refused, timeout=30, interval=0.1, what="the API to refuse a submission")
    to_503 = time.monotonic() - filled
    assert first_503.status_code == 503, (first_503.status_code, first_503.text[:500])
    reads: list[int] = []
    failed_while_full: list[str] = []

    def while_full() -> None:
        probes.append(post(api, f"probe-{len(probes)}"))
        seen = api.get("/v1/jobs", params={"ids": ",".join(accepted[:100]), "limit": 100})
        reads.append(seen.status_code)
        if seen.status_code == 200:
            failed_while_full.extend(r["id"] for r in seen.json()["jobs"] if r["status"] == "failed")

    every_second_for(FULL_S, while_full)
    status_while_full = api.get("/v1/status")
    health_while_full = api.get("/healthz")
    filler.unlink()
    freed = time.monotonic()
    freed_wall = time.time()

    second_jobs = [
        {**job, "idempotency_key": f"after-{n}"} for n, job in enumerate(scripted_jobs(SECOND_WAVE, trace_dir, SLEEP))
    ]
    second = submit_until_accepted(api, second_jobs)
    to_accept = time.monotonic() - freed
    final = wait_all_terminal(api, accepted + second, timeout=240)
    records = {i: api.get(f"/v1/jobs/{i}").json() for i in accepted + second}

    # While the disk was full: every refusal a 503 that names the cause; no 500, reads answered.
    codes = sorted({r.status_code for r in probes})
    assert set(codes) <= {202, 503}, [(r.status_code, r.text[:300]) for r in probes if r.status_code not in (202, 503)]
    body = first_503.json()
    assert "Redis" in body["detail"] and ENOSPC in body["detail"], body
    assert first_503.headers.get("Retry-After"), first_503.headers
    assert reads and all(code == 200 for code in reads), reads
    # What an operator's health check sees: Redis up but refusing writes, not "unreachable".
    assert health_while_full.status_code == 503, health_while_full.text
    assert health_while_full.json()["redis"].startswith("refusing writes: MISCONF"), health_while_full.json()
    assert not failed_while_full, {i: records[i].get("error") for i in set(failed_while_full)}
    # Every accepted job done once with its record; nothing lost, nothing failed.
    assert len(final) == len(accepted) + len(second)
    assert all(s == "done" for s in final.values()), {
        i: records[i].get("error") for i, s in final.items() if s != "done"
    }
    assert all(r["result"]["reward"] == 1.0 for r in records.values())
    for stage in STAGES:
        ran_twice = [i for i in accepted if sum(line.startswith(f"{stage} end") for line in trace(trace_dir, i)) > 1]
        unfenced = [i for i in ran_twice if records[i]["attempts"][stage] < 2]
        assert not unfenced, f"{stage} ran to its end twice in one attempt: {unfenced}"
    # The same worker processes: nothing restarted.
    assert {stage: [p.pid for p in stack.workers[stage]] for stage in STAGES} == pids

    resumed = min(
        (
            r["timings"]["eval"]["ended"] - freed_wall
            for r in records.values()
            if r["timings"]["eval"]["ended"] >= freed_wall
        ),
        default=float("nan"),
    )
    reruns = sum(
        max(0, sum(line.startswith(f"{stage} start") for line in trace(trace_dir, i)) - 1)
        for i in accepted
        for stage in STAGES
    )
    figure(
        f"Redis' {DISK_BYTES >> 20} MiB disk full for {freed - filled:.1f} s: POST 503 {to_503:.2f} s after the fill "
        f"({sum(r.status_code == 503 for r in probes)} of {len(probes)} probes 503, "
        f"{sum(r.status_code == 202 for r in probes)} accepted before Redis noticed); "
        f"while full /v1/status {status_while_full.status_code} ({status_while_full.json().get('detail')!r}), "
        f"/healthz {health_while_full.status_code} {health_while_full.json()}; after the filler went: POST accepted in "
        f"{to_accept:.2f} s, a job done {resumed:.1f} s after; all {len(final)} jobs done once, none lost, "
        f"{reruns} stage re-runs; 503 body: {body['detail']!r}"
    )


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ResponseError("MISCONF Errors writing to the AOF file: No space left on device"), "MISCONF Errors"),
        (
            ResponseError("Command # 1 (SADD rq:queues rq:queue:eval) of pipeline caused error: MISCONF Errors x"),
            "MISCONF Errors x",
        ),
        (ReadOnlyError("You can't write against a read only replica."), "You can't write"),
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "command not allowed"),
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), None),
        (ResponseError("ERR value is not an integer: MISCONF "), None),
        (RedisConnectionError("Connection refused"), None),
    ],
)
def test_write_refusals_are_told_from_other_redis_errors(error: Exception, reason: str | None) -> None:
    """What the API answers 503 for and the workers hold their writes through; any other error
    reply is a bug (a 500, a failed job), and an unreachable Redis has its own path."""
    found = write_refusal(error)
    assert (found is None) if reason is None else (found is not None and found.startswith(reason)), found
