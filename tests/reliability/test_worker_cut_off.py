"""A rollout worker cut off from Redis mid-stage (alive, its connections blackholed, Redis up for the
rest): its attempt is given up, the job runs again on the other worker and finishes there; when the
cut heals, the cut-off worker's late writes are refused by the fencing token (the attempt number),
and it goes on to take new jobs. Nothing lost, nothing done twice."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from redis import Redis
from rq.registry import StartedJobRegistry

from cli.stack import Stack
from shared.config import STAGES
from shared.errors import StoredResultCorrupt
from shared.jobs.queues import queue_name
from shared.jobs.record_fields import ref_field
from shared.keys import Keys
from shared.redis_conn import write_url_file
from shared.results.store import ResultStore
from tests.reliability.jobs import submit, wait_all_terminal
from tests.support.holds import Gate
from tests.support.tcp_blackhole import TcpBlackhole
from tests.support.waiting import client_for, job, trace, wait_for

# The cut-off worker's first attempt runs this long: past the cut, the give-up (heartbeat TTL 6 s,
# maintenance every 2 s) and the job's run elsewhere, so its late write comes after the job is done.
# Later attempts do not sleep. A slower machine only moves the late write earlier: still refused.
CUT_ATTEMPT_S = 30.0
# What a refused late write leaves as it was: the job's place, its attempts, who ran it, when, its
# reward, and its count of lost workers (one: the cut-off one).
STABLE = ("status", "attempts", "workers", "timings", "reward", "lost")


@dataclass
class Run:
    """The stack, its two one-slot rollout workers (one reaching Redis only through `proxy`), the API."""

    stack: Stack
    api: httpx.Client
    proxy: TcpBlackhole
    direct: subprocess.Popen[bytes]
    cut_off: subprocess.Popen[bytes]
    trace_dir: Path


def test_a_worker_cut_off_mid_stage_is_given_up_and_its_late_write_refused(make_stack, trace_dir, tmp_path, figure):
    stack = make_stack(concurrency={"init": 1, "rollout": 1, "eval": 1})
    assert stack.redis is not None
    proxy = TcpBlackhole(("127.0.0.1", stack.redis.port)).start()
    busy = Gate(tmp_path / "busy.release")
    try:
        run, holder = _two_rollout_workers(stack, proxy, busy, trace_dir, tmp_path / "proxied-redis.url")
        victim = _submit_to_cut_off(run)
        cut, done, held = _cut_until_done_elsewhere(run, victim, busy)
        proxy.restore()
        restored = time.monotonic()
        after = _each_worker_takes_one(run, Gate(tmp_path / "later.release"))
        back_s = time.monotonic() - restored
        ids = [holder, victim, *after]
        final = wait_all_terminal(run.api, ids, timeout=120)
        assert run.cut_off.poll() is None, "the cut-off worker died"
        # Nothing of the cut-off attempt left to be given up again later (that would count it lost twice).
        wait_for(lambda: _nothing_started(stack), timeout=60, what="every stage's started registry to empty")
        later = job(run.api, victim)
        stored = _stored_path(stack, victim, "rollout")
    finally:
        proxy.restore()
        stack.stop(timeout=10)  # before the proxy goes: the cut-off worker drains through it
        proxy.stop()

    assert set(final.values()) == {"done"}, final
    _assert_each_job_done_once(trace_dir, ids)
    _assert_late_write_refused(done, later, run)
    ended = done["timings"]["eval"]["ended"]
    rq_late = [line for line in _log(tmp_path, "rollout-1") if victim in line and "rq failed to record" in line]
    figure(
        f"cut mid-rollout (attempt 1, {CUT_ATTEMPT_S:.0f} s): given up and taken again "
        f"{done['timings']['rollout']['started'] - cut:.1f} s after the cut (TTL 6 s), done elsewhere "
        f"{ended - cut:.1f} s after it; its late hand-on ({held} B held in the cut) refused, record unchanged "
        f"(attempts.rollout 2, lost 1); rq's late bookkeeping: {len(rq_late)} KeyError, record stands; "
        f"cut-off worker (same pid) took a new job {back_s:.1f} s after the restore; {len(ids)} jobs done once; "
        f"stored rollouts {sorted(p.name.split('.', 1)[1] for p in stored.parent.glob(f'{victim}.rollout.*'))}, "
        f"the record's written {stored.stat().st_mtime - ended:+.1f} s from done"
    )
    assert stored.stat().st_mtime <= ended, "the late attempt overwrote the stored rollout the record refers to"


def test_two_attempts_of_a_stage_keep_their_stored_outputs_apart(tmp_path: Path) -> None:
    """The results store's side of the fencing token: a late attempt's file never replaces the file of
    the attempt whose record write won, and a reference without an attempt (older records) reads as before."""
    store = ResultStore(tmp_path)
    won, _ = store.put("job1", "rollout", {"by": "attempt 2"}, attempt=2)
    late, _ = store.put("job1", "rollout", {"by": "attempt 1"}, attempt=1)
    assert store.get("job1", "rollout", won) == {"by": "attempt 2"}
    assert store.get("job1", "rollout", late) == {"by": "attempt 1"}
    plain, _ = store.put("job1", "rollout", {"by": "no attempt"})
    assert store.path("job1", "rollout", plain).name == "job1.rollout.msgpack.zst"
    with pytest.raises(StoredResultCorrupt):
        store.path("job1", "rollout", f"{plain}.a1/../x")


def _two_rollout_workers(
    stack: Stack, proxy: TcpBlackhole, busy: Gate, trace_dir: Path, url_file: Path
) -> tuple[Run, str]:
    """Start the proxied worker while the direct one holds a job (in rollout until `busy` is released),
    so the next job can only go to the proxied one."""
    api = client_for(stack)
    direct = stack.workers["rollout"][0]
    [holder] = submit(api, [_job(trace_dir, "holder", busy.hold("rollout"))])
    _wait_trace(trace_dir, holder, f"rollout start attempt=1 pid={direct.pid}")
    cut_off = _start_proxied_worker(stack, "rollout", proxy, url_file)
    stack.wait_for_workers()
    return Run(stack, api, proxy, direct, cut_off, trace_dir), holder


def _submit_to_cut_off(run: Run) -> str:
    """The job under test, running its first (long) rollout attempt on the proxied worker."""
    sleep = {"sleep": {"rollout": CUT_ATTEMPT_S}, "sleep_first_attempt_only": True}
    [victim] = submit(run.api, [_job(run.trace_dir, "victim", sleep)])
    _wait_trace(run.trace_dir, victim, f"rollout start attempt=1 pid={run.cut_off.pid}")
    return victim


def _cut_until_done_elsewhere(run: Run, victim: str, busy: Gate) -> tuple[float, dict[str, Any], int]:
    """Blackhole the proxied worker, free the direct one, and wait for the victim to be done there and
    for the cut-off attempt to end its stage (its hand-on then waits in the blackhole).
    Returns the cut's wall time (as the record's timings), the record once done, and the bytes held."""
    run.proxy.blackhole()
    cut = time.time()
    busy.release()
    done = _wait_record(run.api, victim, lambda r: r["status"] == "done", "the victim done elsewhere")
    _wait_trace(run.trace_dir, victim, f"rollout end attempt=1 pid={run.cut_off.pid}", timeout=CUT_ATTEMPT_S + 60)
    held = wait_for(lambda: run.proxy.held_bytes, timeout=30, what="the cut-off worker's writes to be held")
    return cut, done, held


def _each_worker_takes_one(run: Run, later: Gate) -> list[str]:
    """Two held jobs, two one-slot workers: each takes one, so the cut-off worker takes new jobs again.
    Its one slot takes a job only once its run of the victim has returned: its late write is answered."""
    after = submit(run.api, [_job(run.trace_dir, f"after-{i}", later.hold("rollout")) for i in range(2)])
    pids = {_wait_trace(run.trace_dir, job_id, "rollout start").split("pid=")[1] for job_id in after}
    assert pids == {str(run.direct.pid), str(run.cut_off.pid)}, pids
    later.release()
    return after


def _job(trace_dir: Path, key: str, options: dict[str, Any]) -> dict[str, Any]:
    return {"task": {"kind": "scripted", "trace": str(trace_dir), **options}, "idempotency_key": f"cut-off-{key}"}


def _start_proxied_worker(stack: Stack, stage: str, proxy: TcpBlackhole, url_file: Path) -> subprocess.Popen[bytes]:
    """One more worker of `stage`, started by the stack as any other, but reaching Redis through `proxy`:
    the stack hands its children the Redis URL in a file, so this one gets a file naming the proxy."""
    assert stack.redis_url is not None and stack.redis_url_file is not None
    parts = urlsplit(stack.redis_url)
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{proxy.port}"
    write_url_file(url_file, urlunsplit(parts._replace(netloc=netloc)))
    own = stack.redis_url_file
    stack.redis_url_file = url_file
    try:
        return stack.start_worker(stage)
    finally:
        stack.redis_url_file = own


def _assert_late_write_refused(done: dict[str, Any], later: dict[str, Any], run: Run) -> None:
    """The record after the cut-off worker's late write is the record of the job done elsewhere, and
    the rollout ran to its end once in each worker (attempt 1 cut off, attempt 2 the one that counts)."""
    assert {k: later.get(k) for k in STABLE} == {k: done.get(k) for k in STABLE}, (done, later)
    assert later["attempts"]["rollout"] == 2 and later["lost"] == {"rollout": 1}, later
    assert f".{run.direct.pid}." in later["workers"]["rollout"], later["workers"]
    ends = sorted(line for line in trace(run.trace_dir, later["id"]) if line.startswith("rollout end"))
    assert ends == [f"rollout end attempt=1 pid={run.cut_off.pid}", f"rollout end attempt=2 pid={run.direct.pid}"]


def _assert_each_job_done_once(trace_dir: Path, ids: list[str]) -> None:
    """Every job's eval ended exactly once (a second end would be a job done twice)."""
    for job_id in ids:
        ends = [line for line in trace(trace_dir, job_id) if line.startswith("eval end")]
        assert len(ends) == 1, (job_id, trace(trace_dir, job_id))


def _nothing_started(stack: Stack) -> bool:
    """No rq job is in any stage's started registry (read without rq's cleanup, which would act)."""
    with Redis.from_url(stack.redis_url) as redis:
        return not any(redis.zcard(StartedJobRegistry(queue_name(s), connection=redis).key) for s in STAGES)


def _stored_path(stack: Stack, job_id: str, part: str) -> Path:
    """The results-store file the record refers to for `part` (the reference is not in the public view)."""
    with Redis.from_url(stack.redis_url) as redis:
        ref = redis.hget(Keys(stack.settings.redis_prefix).job(job_id), ref_field(part))
    assert ref is not None, f"job {job_id} has no stored {part}"
    return ResultStore(stack.settings.results).path(job_id, part, ref.decode())


def _wait_trace(trace_dir: Path, job_id: str, prefix: str, timeout: float = 60) -> str:
    """The first trace line of the job that starts with `prefix`."""

    def line() -> str | None:
        return next((seen for seen in trace(trace_dir, job_id) if seen.startswith(prefix)), None)

    return wait_for(line, timeout=timeout, interval=0.1, what=f"job {job_id}: {prefix!r} in its trace")


def _wait_record(api: httpx.Client, job_id: str, reached: Any, what: str, timeout: float = 90) -> dict[str, Any]:
    def record() -> dict[str, Any] | None:
        seen = job(api, job_id)
        return seen if reached(seen) else None

    return wait_for(record, timeout=timeout, interval=0.1, what=f"job {job_id}: {what}")


def _log(tmp_path: Path, name: str) -> list[str]:
    """A stack child's log lines (make_stack keeps them under tmp_path/logs, one file per child)."""
    path = tmp_path / "logs" / f"{name}.log"
    return path.read_text(errors="replace").splitlines() if path.exists() else []
