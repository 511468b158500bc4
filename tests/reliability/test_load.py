"""Load: 1,000 jobs queued at once, 200 in flight in the rollout stage, on this 2-core machine.

The rollout stage is the `scripted` kind sleeping cooperatively (an LLM-bound rollout waiting on
its backend), so the figure is the service's own overhead: API latency while the queues are
full, worker memory with 100 slots per process, and nothing lost.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from pathlib import Path

import httpx

from tests.reliability.jobs import scripted_jobs, statuses, submit
from tests.support.waiting import TERMINAL, client_for

JOBS = int(os.environ.get("ROLLOUTS_LOAD_JOBS", "1000"))
ROLLOUT_SLOTS_PER_PROCESS = 100  # two processes: 200 in flight
SLEEP = {"init": 0.0, "rollout": 8.0, "eval": 0.0}  # init feeds ~25 jobs/s here: 8 s fills 200 slots


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class LatencyProbe(threading.Thread):
    """Reads jobs and the status page in a loop, as a trainer polling would, timing each request."""

    def __init__(self, base_url: str, ids: list[str]) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=base_url, timeout=30.0)
        self.ids = ids
        self.job_reads: list[float] = []
        self.list_reads: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        rng = random.Random(7)
        while not self.stop.is_set():
            try:
                started = time.perf_counter()
                self.client.get(f"/v1/jobs/{rng.choice(self.ids)}").raise_for_status()
                self.job_reads.append(time.perf_counter() - started)
                started = time.perf_counter()
                self.client.get("/v1/jobs", params={"ids": ",".join(rng.sample(self.ids, 50))}).raise_for_status()
                self.list_reads.append(time.perf_counter() - started)
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))
            self.stop.wait(0.05)


def test_a_thousand_jobs_with_two_hundred_in_flight_lose_nothing(make_stack, figure):
    stack = make_stack(concurrency={"init": 8, "rollout": ROLLOUT_SLOTS_PER_PROCESS, "eval": 8})
    stack.start_worker("rollout")
    stack.wait_for_workers(timeout=60)
    api = client_for(stack)

    started = time.perf_counter()
    ids = submit(api, scripted_jobs(JOBS, None, SLEEP), chunk=250)
    submitted = time.perf_counter() - started
    probe = LatencyProbe(stack.api_url, ids)
    probe.start()

    peak, rss = 0, {}
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        seen = statuses(api, ids)
        if len(seen) == JOBS and all(status in TERMINAL for status in seen.values()):
            break
        running = api.get("/v1/status").json()["stages"]["rollout"]["running"]
        if running > peak:
            peak = running
            rss = {f"{stage}-{i}": _rss_mib(p.pid) for stage, procs in stack.workers.items() for i, p in enumerate(procs)}
        time.sleep(0.5)
    final = statuses(api, ids)
    elapsed = time.perf_counter() - started
    probe.stop.set()
    probe.join(timeout=30)

    assert len(set(ids)) == JOBS and len(final) == JOBS
    assert all(status == "done" for status in final.values()), {s for s in final.values()}
    assert not probe.errors, probe.errors[:3]  # every read under load answered
    reads, lists = probe.job_reads, probe.list_reads
    figure(
        f"{JOBS} jobs submitted in {submitted:.1f} s, {peak} rollouts running at peak, all done in "
        f"{elapsed:.0f} s ({JOBS / elapsed:.0f} jobs/s), none lost"
    )
    figure(
        f"API under load: GET /v1/jobs/{{id}} p50 {statistics.median(reads) * 1000:.0f} ms, "
        f"p99 {_percentile(reads, 0.99) * 1000:.0f} ms (n={len(reads)}); GET /v1/jobs?ids=<50> "
        f"p50 {statistics.median(lists) * 1000:.0f} ms, p99 {_percentile(lists, 0.99) * 1000:.0f} ms"
    )
    figure("worker RSS at peak (MiB): " + ", ".join(f"{name} {mib:.0f}" for name, mib in sorted(rss.items())))
