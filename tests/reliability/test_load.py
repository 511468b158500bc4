"""Load: 1,000 agent jobs queued at once, 200 rollouts in flight against stand-in vLLM servers.

The rollout stage runs the real agent loop (chat template, token record, tool-call
parsing, the routed LLM client with pool acquire/release per call) of the `agent-answer`
kind: LLM turns only (no sandbox: 200 of them would not fit on 2 cores), ending in a
`finish` with a boxed answer that the eval stage scores. The LLMs are two stand-in servers
(tests/support/standin_llm.py) speaking vLLM's /v1/completions, registered in the backend
pool, each "generating" for 2-4 s per turn. Measured: API latency while the queues are
full, peak in-flight rollouts and generations, worker memory, turns per second.
Asserted: nothing lost (every job done once, with the reward its script implies), no
failed rq jobs, the pool's in-flight counters and leases back to zero, no API errors.
`ROLLOUTS_LOAD_JOBS` changes the job count.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
from redis import Redis

from cli.embedded_redis import free_port
from cli.stack import Stack
from cli.tiny_model import build_tokenizer
from shared.keys import Keys
from shared.trajectory import Trajectory
from tests.reliability.jobs import statuses, submit
from tests.support.standin_llm import StandinProcess, marker
from tests.support.waiting import TERMINAL, client_for, wait_for

JOBS = int(os.environ.get("ROLLOUTS_LOAD_JOBS", "1000"))
FINISH_CAP_S = 1800.0
ROLLOUT_SLOTS_PER_PROCESS = 100  # two processes: 200 in flight
BACKENDS = 2
# Per turn; with 2-4 turns a rollout takes ~9 s, which 200 slots fed by init at ~25 jobs/s keep full.
TURN_DELAY_S = (2.0, 4.0)


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _script(i: int) -> tuple[int, str, float]:
    """Job i's episode: (assistant turns, the answer the stand-in gives, the reward that earns)."""
    turns = 2 + i % 3
    right = str(7 * i)
    wrong = i % 5 == 0  # every fifth job answers wrong, so the eval stage really decides
    return turns, (f"{right}1" if wrong else right), (0.0 if wrong else 1.0)


def agent_jobs(n: int) -> list[dict[str, Any]]:
    jobs = []
    for i in range(n):
        turns, answer, _ = _script(i)
        task = {
            "kind": "agent-answer",
            "problem": f"What is 7 times {i}? {marker(turns, answer)}",
            "answer": str(7 * i),
            "stop_on_no_tool_call": False,
        }
        jobs.append(
            {"task": task, "limits": {"max_turns": 8}, "sampling": {"max_tokens": 256}, "idempotency_key": f"load-{i}"}
        )
    return jobs


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
                some = rng.sample(self.ids, min(50, len(self.ids)))
                self.client.get("/v1/jobs", params={"ids": ",".join(some)}).raise_for_status()
                self.list_reads.append(time.perf_counter() - started)
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))
            self.stop.wait(0.05)


@pytest.fixture()
def tokenizer_dir(tmp_path: Path) -> Path:
    """The CPU backend's byte-level ChatML tokenizer, without building its model (no torch needed)."""
    path = tmp_path / "tokenizer"
    build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture()
def standins(tmp_path: Path, tokenizer_dir: Path) -> Iterator[list[StandinProcess]]:
    servers = [
        StandinProcess(tokenizer_dir, free_port(), TURN_DELAY_S, tmp_path / f"standin-{n}.log", seed=n)
        for n in range(BACKENDS)
    ]
    try:
        yield [server.wait_healthy() for server in servers]
    finally:
        for server in servers:
            server.stop()


def _pool_leftovers(stack: Stack) -> dict[str, int]:
    """What the pool still holds for trajectories: charges, leases, route pins (all 0 when nothing leaked)."""
    keys, redis = Keys(stack.settings.redis_prefix), Redis.from_url(stack.redis_url)
    try:
        return {
            "charges": redis.hlen(keys.llm_charges),
            "leases": redis.zcard(keys.llm_leases),
            "routes": redis.hlen(keys.llm_routes),
            "route_refs": redis.hlen(keys.llm_route_refs),
            "inflight": sum(int(v) for v in redis.hvals(keys.backend_inflight)),
        }
    finally:
        redis.close()


def test_a_thousand_agent_jobs_with_two_hundred_in_flight_lose_nothing(
    make_stack, standins: list[StandinProcess], tokenizer_dir: Path, figure
) -> None:
    env = {
        "ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds",
        "ROLLOUTS_LLM_HEARTBEAT_TIMEOUT_S": "600",  # the stand-ins do not beat; maintenance still probes /health
    }
    stack = make_stack(concurrency={"init": 8, "rollout": ROLLOUT_SLOTS_PER_PROCESS, "eval": 8}, env=env)
    stack.start_worker("rollout")
    stack.wait_for_workers(timeout=60)
    api = client_for(stack)
    idle = {f"{stage}-{n}": _rss_mib(p.pid) for stage, procs in stack.workers.items() for n, p in enumerate(procs)}
    for server in standins:
        registered = api.post("/v1/backends", json={"url": server.url, "model": server.model, "capacity": 100})
        assert registered.status_code == 201, registered.text

    started = time.perf_counter()
    ids = submit(api, agent_jobs(JOBS), chunk=250)
    submitted = time.perf_counter() - started
    probe = LatencyProbe(stack.api_url, ids)
    probe.start()

    peak = {"running": 0, "pool": 0, "generating": 0}
    rss: dict[str, float] = {}
    # A cap for a machine of any speed (the run takes a few minutes on a quiet one), not a speed test:
    # past it, the test says how many jobs were in which state.
    deadline = time.monotonic() + FINISH_CAP_S
    while True:
        seen = statuses(api, ids)
        if len(seen) == JOBS and all(status in TERMINAL for status in seen.values()):
            break
        if time.monotonic() > deadline:
            probe.stop.set()
            left = Counter(status for status in seen.values() if status not in TERMINAL)
            raise AssertionError(
                f"{sum(left.values()) + JOBS - len(seen)} of {JOBS} jobs not finished after "
                f"{FINISH_CAP_S:.0f} s: {dict(left)}, {JOBS - len(seen)} unknown to the API"
            )
        peak["running"] = max(peak["running"], api.get("/v1/status").json()["stages"]["rollout"]["running"])
        peak["pool"] = max(peak["pool"], api.get("/v1/backends").json()["inflight"])
        peak["generating"] = max(peak["generating"], sum(server.stats()["inflight"] for server in standins))
        for stage, procs in stack.workers.items():
            for n, process in enumerate(procs):
                name = f"{stage}-{n}"
                rss[name] = max(rss.get(name, 0.0), _rss_mib(process.pid))
        time.sleep(0.5)
    elapsed = time.perf_counter() - started
    probe.stop.set()
    probe.join(timeout=30)

    # Nothing lost, nothing twice: every job done once, scored as its script implies.
    final = statuses(api, ids)
    assert len(set(ids)) == JOBS and len(final) == JOBS
    assert all(status == "done" for status in final.values()), {s for s in final.values()}
    status = api.get("/v1/status").json()
    jobs_by_status = {name: count for name, count in status["jobs"].items() if count}
    assert jobs_by_status == {"done": JOBS}, jobs_by_status  # no extra job was created
    for stage, counts in status["stages"].items():
        assert (counts["queued"], counts["running"], counts["failed"]) == (0, 0, 0), (stage, counts)
    leftovers = _pool_leftovers(stack)
    assert leftovers == dict.fromkeys(leftovers, 0), leftovers  # every trajectory released its backend
    assert all(b["inflight"] == 0 for b in api.get("/v1/backends").json()["backends"])
    assert not probe.errors, probe.errors[:3]  # every read under load answered

    turns = reruns = 0
    call_latencies: list[float] = []  # per LLM call, as the agent loop timed it
    loop_overheads: list[float] = []  # per rollout: time in the loop not spent waiting on the LLM
    routing: list[float] = []  # per call: pool acquire and the hand-off to the call's thread, around the HTTP call
    for n, job_id in enumerate(ids):
        record = msgpack.unpackb(api.get(f"/v1/jobs/{job_id}", headers={"Accept": "application/msgpack"}).content)
        expected_turns, _, reward = _script(n)
        assert record["result"]["reward"] == reward, (job_id, record["result"]["evaluation"])
        trajectory = Trajectory.from_dict(record["result"]["trajectory"])  # checks the token invariants
        assert trajectory.stop_reason == "finish" and trajectory.counts.turns == expected_turns, job_id
        turns += trajectory.counts.turns
        latencies = [t.latency_s for t in trajectory.turns if t.latency_s is not None]
        call_latencies += latencies
        routing.append((trajectory.timings["llm_s"] - sum(latencies)) / len(latencies))
        loop_overheads.append(trajectory.timings["total_s"] - trajectory.timings["llm_s"])
        reruns += sum(record["attempts"].values()) - len(record["attempts"])
    stats = [server.stats() for server in standins]
    served = sum(s["served"] for s in stats)
    assert sum(s["refused"] for s in stats) == 0
    # Every generation served went into exactly one finished trajectory (unless a stage was re-run).
    assert served == turns if reruns == 0 else served >= turns, (served, turns, reruns)

    reads, lists = probe.job_reads, probe.list_reads
    figure(
        f"{JOBS} agent jobs submitted in {submitted:.1f} s, all done in {elapsed:.0f} s "
        f"({JOBS / elapsed:.1f} jobs/s), none lost, none twice, {reruns} stage re-runs"
    )
    figure(
        f"in flight at peak: {peak['running']} rollouts running, {peak['pool']} trajectories charged in the pool, "
        f"{peak['generating']} generations at the stand-ins; pool counters and leases 0 at the end"
    )
    figure(
        f"stand-ins served {served} completions ({' + '.join(str(s['served']) for s in stats)} over {BACKENDS} "
        f"backends) = {turns} turns, {turns / elapsed:.1f} turns/s, {TURN_DELAY_S[0]:g}-{TURN_DELAY_S[1]:g} s per turn"
    )
    mean_delay = sum(TURN_DELAY_S) / 2
    figure(
        f"agent loop under load: LLM call p50 {statistics.median(call_latencies):.2f} s, "
        f"p99 {_percentile(call_latencies, 0.99):.2f} s for a {mean_delay:g} s mean stand-in delay, plus routing "
        f"p50 {statistics.median(routing) * 1000:.0f} ms, p99 {_percentile(routing, 0.99) * 1000:.0f} ms a call; "
        f"time in the loop outside LLM calls per rollout p50 {statistics.median(loop_overheads) * 1000:.0f} ms, "
        f"p99 {_percentile(loop_overheads, 0.99) * 1000:.0f} ms"
    )
    figure(
        f"API under load: GET /v1/jobs/{{id}} p50 {statistics.median(reads) * 1000:.0f} ms, "
        f"p99 {_percentile(reads, 0.99) * 1000:.0f} ms (n={len(reads)}); GET /v1/jobs?ids=<50> "
        f"p50 {statistics.median(lists) * 1000:.0f} ms, p99 {_percentile(lists, 0.99) * 1000:.0f} ms (n={len(lists)})"
    )
    memory = ", ".join(f"{name} {idle[name]:.0f} -> {mib:.0f}" for name, mib in sorted(rss.items()))
    figure(f"worker RSS idle -> peak (MiB): {memory}")


def test_backend_counts_return_to_zero_after_jobs_with_rollout_worker_kills(
    make_stack, standins: list[StandinProcess], figure
) -> None:
    """In-flight counts are released on every end of a trajectory, a killed worker's included."""
    env = {
        "ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds",
        "ROLLOUTS_LLM_HEARTBEAT_TIMEOUT_S": "600",
        "ROLLOUTS_STAGE_RETRIES": "25",  # above the kills a job could meet: re-run, not failed as lost
    }
    stack = make_stack(concurrency={"init": 8, "rollout": 40, "eval": 8}, env=env)
    stack.start_worker("rollout")  # two: one keeps working while the other is killed
    stack.wait_for_workers(timeout=60)
    api = client_for(stack)
    for server in standins:
        assert (
            api.post("/v1/backends", json={"url": server.url, "model": server.model, "capacity": 50}).status_code == 201
        )
    ids = submit(api, agent_jobs(200), chunk=200)
    for _ in range(5):
        wait_for(lambda: api.get("/v1/backends").json()["inflight"] >= 10, timeout=120, what="trajectories in flight")
        victim = stack.workers["rollout"][0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        stack.workers["rollout"].remove(victim)
        stack.start_worker("rollout")
    wait_for(
        lambda: all(s in TERMINAL for s in statuses(api, ids).values()),
        timeout=900,
        interval=1.0,
        what="every job to end",
    )
    final = statuses(api, ids)
    assert set(final.values()) == {"done"}, {s for s in final.values()}
    leftovers = _pool_leftovers(stack)
    assert leftovers == dict.fromkeys(leftovers, 0), leftovers
    redis = Redis.from_url(stack.redis_url)
    try:
        scores = redis.zrange(Keys(stack.settings.redis_prefix).backend_load, 0, -1, withscores=True)
    finally:
        redis.close()
    assert len(scores) == len(standins) and all(score == 0 for _, score in scores), scores
    figure("200 agent jobs, 5 rollout-worker SIGKILLs: all done; pool in-flight and load scores back to 0")
