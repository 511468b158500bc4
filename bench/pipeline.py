"""Pipeline overhead: no-op jobs through init -> rollout -> eval, vs a bare chain of three rq jobs.

Both run on one embedded redis-server with the same number of workers per stage
(one process, one job at a time, no fork: rq's SimpleWorker for the bare chain,
our slot worker with concurrency 1 for the pipeline). The pipeline's jobs go in
through the HTTP API and carry the whole job record (status moves, timings,
fencing tokens, cancel checks); the bare chain only enqueues the next function.
A third run shows the same pipeline with 4 slots per stage process. API submit
latency is measured on single-job POSTs over a keep-alive connection (stdlib client).

    .venv/bin/python -m bench.pipeline [--jobs 1000] [--rounds 2] [--slots 1 4] [--submits 300]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from redis import Redis
from rq import Queue, Worker

from bench.noop_stages import BARE_DONE_KEY, bare_init
from cli.embedded_redis import EmbeddedRedis
from cli.stack import Stack
from shared.config import Settings
from shared.keys import Keys

NOOP_ENV = {"ROLLOUTS_TASK_MODULES": "bench.noop_stages", "ROLLOUTS_LOG_LEVEL": "WARNING"}


def wait_until(condition, timeout: float = 600.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark run did not finish")
        time.sleep(0.01)


def run_bare(redis_url: str, jobs: int, log_dir: Path) -> float:
    redis = Redis.from_url(redis_url)
    redis.flushall()
    env = {**os.environ, **NOOP_ENV}
    with contextlib.ExitStack() as logs:  # each worker holds its own copy of its log's descriptor
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rq.cli",
                    "worker",
                    "-w",
                    "rq.worker.SimpleWorker",
                    "-u",
                    redis_url,
                    "-q",
                    queue,
                ],
                env=env,
                stdout=logs.enter_context(open(log_dir / f"bare-{queue}.log", "ab")),
                stderr=subprocess.STDOUT,
            )
            for queue in ("bare-init", "bare-rollout", "bare-eval")
        ]
    try:
        wait_until(lambda: Worker.count(connection=redis) >= 3)  # the three workers have registered
        queue = Queue("bare-init", connection=redis)
        start = time.perf_counter()
        queue.enqueue_many([Queue.prepare_data(bare_init, (i,), result_ttl=0) for i in range(jobs)])
        wait_until(lambda: int(redis.get(BARE_DONE_KEY) or 0) >= jobs)
        return time.perf_counter() - start
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait()


def run_pipeline(redis_url: str, jobs: int, slots: int, log_dir: Path, submits: int) -> tuple[float, list[float]]:
    redis = Redis.from_url(redis_url)
    redis.flushall()
    settings = Settings(redis_url=redis_url, state_dir=Path(tempfile.mkdtemp(prefix="bench-state-")))
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": slots, "rollout": slots, "eval": slots},
        log_dir=log_dir,
        extra_env=NOOP_ENV,
    )
    with stack:
        stack.wait_for_workers()
        done_index = Keys().jobs_by_status("done")
        with httpx.Client(base_url=stack.api_url, timeout=30) as api:
            latencies = submit_latencies(api, submits)  # single-job POSTs; these jobs run too
            wait_until(lambda: redis.zcard(done_index) >= submits)
            start = time.perf_counter()
            for first in range(0, jobs, 500):
                body = [{"task": {"kind": "noop"}}] * min(500, jobs - first)
                assert api.post("/v1/jobs", json=body).status_code == 202
            wait_until(lambda: redis.zcard(done_index) >= submits + jobs)
            elapsed = time.perf_counter() - start
    return elapsed, latencies


def submit_latencies(api: httpx.Client, count: int) -> list[float]:
    """Single-job POSTs over one keep-alive connection with the stdlib client: httpx alone adds
    about 3 ms a request here, which would measure the client rather than the API."""
    connection = http.client.HTTPConnection(api.base_url.host, api.base_url.port)
    body = json.dumps({"task": {"kind": "noop"}})
    out = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            connection.request("POST", "/v1/jobs", body=body, headers={"content-type": "application/json"})
            response = connection.getresponse()
            response.read()
            out.append(time.perf_counter() - start)
            assert response.status == 202
    finally:
        connection.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per run (submitted 500 per POST)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; the median is reported")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 4], help="a pipeline run per slots per process")
    parser.add_argument("--submits", type=int, default=300, help="single-job POSTs timed before each pipeline run")
    args = parser.parse_args(argv)
    jobs = max(1, args.jobs)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    results: dict[str, list[float]] = {"bare": [], **{f"pipeline x{slots}": [] for slots in args.slots}}
    latencies: list[float] = []  # the first pipeline run's
    with EmbeddedRedis() as redis_server:
        for _ in range(args.rounds):
            results["bare"].append(run_bare(redis_server.url, jobs, log_dir))
            for i, slots in enumerate(args.slots):
                elapsed, lat = run_pipeline(redis_server.url, jobs, slots, log_dir, args.submits)
                results[f"pipeline x{slots}"].append(elapsed)
                latencies += lat if i == 0 else []

    bare = statistics.median(results["bare"])
    print(f"{jobs} no-op jobs x 3 stages, {args.rounds} rounds (median); logs in {log_dir}")
    print(f"{'run':<14} {'jobs/s':>8} {'ms/job':>8} {'vs bare':>8}")
    for name, times in results.items():
        t = statistics.median(times)
        print(f"{name:<14} {jobs / t:>8.1f} {1000 * t / jobs:>8.2f} {bare / t:>7.2f}x")
    ordered = sorted(latencies)
    p50 = ordered[len(ordered) // 2] * 1000
    p99 = ordered[int(len(ordered) * 0.99)] * 1000
    print(f"API submit (one job per POST, {len(ordered)} requests): p50 {p50:.2f} ms, p99 {p99:.2f} ms")


if __name__ == "__main__":
    main()
