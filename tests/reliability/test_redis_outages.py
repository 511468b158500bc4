"""Redis away for seconds mid-run, killed (then restarted on its AOF) or frozen (SIGSTOP, then SIGCONT).

rq's work loop quits on a Redis error it does not retry itself, so before the slot supervisor
an outage of a few seconds left live worker processes with no slots: nothing finished again and
/v1/status showed no workers. Checked here, with jobs in every stage when Redis goes away:
- the API answers 503 while Redis is away (how fast is reported, not asserted);
- every job ends `done` once: a stage caught mid-run, or whose result Redis was not there to
  record, is handed back or retried, and when a stage ran to its end twice the record shows the
  later attempt (the attempt counter fences the earlier one, so only one moved the job on);
- the same worker processes live on, every slot re-registers (/v1/status) and every slot takes a
  job of a second wave submitted once Redis is back; how soon each stage takes one is reported.
  The second wave is held in each stage (a release file per stage) until that stage's slots all
  hold one of its jobs at once: a slot that resumed late still gets one, one that never resumed
  fails the wait, whatever the relative speeds of the slots.

Outage lengths: ROLLOUTS_REDIS_OUTAGE_S (kill) and ROLLOUTS_REDIS_FREEZE_S (freeze); the figures
for 5, 15 and 30 s in docs/RELIABILITY.md were measured with them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from cli.stack import Stack
from shared.config import STAGES
from tests.reliability.jobs import scripted_jobs, statuses, wait_all_terminal
from tests.reliability.outage_stack import SLEEP, SLOTS, every_second_for, submit_until_accepted
from tests.support.holds import Gate
from tests.support.waiting import client_for, trace, wait_for

KILL_OUTAGE_S = float(os.environ.get("ROLLOUTS_REDIS_OUTAGE_S", "15"))
FREEZE_OUTAGE_S = float(os.environ.get("ROLLOUTS_REDIS_FREEZE_S", "5"))
FIRST_WAVE = 24
SECOND_WAVE = 12


def _kill_and_restart(stack: Stack, seconds: float, during: Callable[[], None]) -> float:
    assert stack.redis is not None and stack.redis.process is not None
    stack.redis.process.kill()
    stack.redis.process.wait()
    every_second_for(seconds, during)
    stack.redis.restart()
    return time.monotonic()


def _freeze_and_thaw(stack: Stack, seconds: float, during: Callable[[], None]) -> float:
    assert stack.redis is not None and stack.redis.process is not None
    stack.redis.process.send_signal(signal.SIGSTOP)
    try:
        every_second_for(seconds, during)
    finally:
        stack.redis.process.send_signal(signal.SIGCONT)
    return time.monotonic()


def _held_in(trace_dir: Path, ids: list[str], stage: str) -> list[str]:
    """The jobs that started `stage` and have not ended it: each holds a slot of that stage."""

    def holding(job_id: str) -> bool:
        lines = trace(trace_dir, job_id)
        started = any(line.startswith(f"{stage} start") for line in lines)
        return started and not any(line.startswith(f"{stage} end") for line in lines)

    return [job_id for job_id in ids if holding(job_id)]


def _all_slots_registered(api: httpx.Client) -> dict | None:
    stages = api.get("/v1/status").json()["stages"]
    ok = all(stages[s]["slots"] == SLOTS[s] and stages[s]["processes"] == 1 for s in STAGES)
    return stages if ok else None


def _first_job_after(api: httpx.Client, ids: list[str], since: float) -> dict[str, dict[str, float]]:
    """stage -> slot name -> seconds from `since` (wall clock) to the first stage it started after it."""
    first: dict[str, dict[str, float]] = {stage: {} for stage in STAGES}
    for job_id in ids:
        record = api.get(f"/v1/jobs/{job_id}").json()
        for stage, slot in record["workers"].items():
            started = record["timings"].get(stage, {}).get("started", 0.0)
            if started >= since:
                first[stage][slot] = min(first[stage].get(slot, float("inf")), started - since)
    return first


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_workers_take_jobs_again_after_a_redis_outage_and_no_job_is_lost(
    persistent_stack: Stack, trace_dir: Path, figure, fault: str, tmp_path: Path
):
    stack = persistent_stack
    api = client_for(stack)
    pids = {stage: [p.pid for p in stack.workers[stage]] for stage in STAGES}
    first = submit_until_accepted(api, scripted_jobs(FIRST_WAVE, trace_dir, SLEEP))
    wait_for(lambda: sum(s == "done" for s in statuses(api, first).values()) >= 1, what="a first job done")
    running = [
        i
        for i in first
        if any(line.startswith("rollout start") for line in trace(trace_dir, i))
        and not any(line.startswith("rollout end") for line in trace(trace_dir, i))
    ]

    answers: list[tuple[int, float]] = []

    def probe_api() -> None:
        started = time.monotonic()
        try:
            code = httpx.get(f"{stack.api_url}/v1/status", timeout=30).status_code
        except httpx.HTTPError:
            code = 0
        answers.append((code, time.monotonic() - started))

    outage = KILL_OUTAGE_S if fault == "kill" else FREEZE_OUTAGE_S
    down = time.monotonic()
    back = (_kill_and_restart if fault == "kill" else _freeze_and_thaw)(stack, outage, probe_api)
    away = back - down

    back_wall = time.time() - (time.monotonic() - back)
    gates = {stage: Gate(tmp_path / f"release-{stage}") for stage in STAGES}
    holds = {"hold": {stage: str(gate.path) for stage, gate in gates.items()}}
    second_jobs = [
        {**job, "task": {**job["task"], **holds}, "idempotency_key": f"second-{n}"}
        for n, job in enumerate(scripted_jobs(SECOND_WAVE, trace_dir, SLEEP))
    ]
    second = submit_until_accepted(api, second_jobs)
    try:
        for stage in STAGES:  # in stage order: a stage's gate lets the wave on to the next stage
            wait_for(
                lambda stage=stage: len(_held_in(trace_dir, second, stage)) >= SLOTS[stage],
                timeout=120,
                what=lambda stage=stage: (
                    f"every {stage} slot to hold a second-wave job (held: "
                    f"{len(_held_in(trace_dir, second, stage))} of {SLOTS[stage]})"
                ),
            )
            gates[stage].release()
    finally:
        for gate in gates.values():
            gate.release()
    final = wait_all_terminal(api, first + second, timeout=240)
    resumed = _first_job_after(api, first + second, back_wall)

    # The API refused with 503 while Redis was away, not a 500 and not a hang.
    assert answers and all(code == 503 for code, _ in answers), answers
    # No job lost, none finished twice; jobs caught mid-stage were handed back or retried.
    assert len(final) == len(first) + len(second)
    assert all(status == "done" for status in final.values()), final
    records = {i: api.get(f"/v1/jobs/{i}").json() for i in first + second}
    for stage in STAGES:
        ran_twice = [i for i in records if sum(line.startswith(f"{stage} end") for line in trace(trace_dir, i)) > 1]
        unfenced = [i for i in ran_twice if records[i]["attempts"][stage] < 2]
        assert not unfenced, f"{stage} ran to its end twice in one attempt: {unfenced}"
    assert all(r["result"]["reward"] == 1.0 for r in records.values())
    # The same worker processes, every slot registered again and every slot took a new job.
    assert all(p.poll() is None for procs in stack.workers.values() for p in procs)
    assert {stage: [p.pid for p in stack.workers[stage]] for stage in STAGES} == pids
    status = wait_for(lambda: _all_slots_registered(api), timeout=30, what="every slot in /v1/status")
    for stage in STAGES:
        assert len(resumed[stage]) == SLOTS[stage], (stage, resumed[stage])  # every slot took a job

    reruns = sum(
        max(0, sum(line.startswith(f"{stage} start") for line in trace(trace_dir, i)) - 1)
        for i in first
        for stage in STAGES
    )
    waits = sorted(seconds for _, seconds in answers)
    figure(
        f"Redis {'SIGKILLed, restarted on its AOF' if fault == 'kill' else 'frozen (SIGSTOP/SIGCONT)'}, "
        f"{away:.1f} s away, {len(running)} rollouts running at the fault: all {len(final)} jobs done, none lost, "
        f"each done once, {reruns} stage re-runs; "
        f"API 503 in {waits[len(waits) // 2]:.2f} s median, {waits[-1]:.2f} s max ({len(waits)} probes); "
        "every slot took a job again within "
        + ", ".join(f"{s} {max(resumed[s].values()):.1f} s" for s in STAGES)
        + " of Redis' return; "
        f"slots registered {sum(status[s]['slots'] for s in STAGES)}/{sum(SLOTS.values())}"
    )
