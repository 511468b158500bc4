"""Redis memory per finished job: what a long run leaves in Redis once its trajectories are in the results store.

Starts the local stack as `rollouts up` does (embedded redis-server with its maxmemory, the API,
one worker process per stage) with the synthetic-trajectory kind (bench/synthetic_trajectory.py:
no model, real trajectory records of --tokens tokens). A warm-up batch first fills what does not
grow per job (workers' registrations, rq's and the metrics' keys, Lua scripts); then --jobs jobs
run, and Redis's used_memory growth over them, after they all end, is divided by their number.
The results store's growth is printed beside it, and the msgpack size of a trajectory (what a
record held in Redis before the results store).

    .venv/bin/python -m bench.redis_memory [--jobs 1000] [--tokens 8192]

The last line is `redis bytes per finished job: N`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
from redis import Redis

from bench.synthetic_trajectory import synthetic_trajectory
from cli.stack import Stack
from shared.codec import pack
from shared.config import Settings
from shared.keys import Keys

ENV = {"ROLLOUTS_TASK_MODULES": "bench.synthetic_trajectory", "ROLLOUTS_LOG_LEVEL": "WARNING"}
CHUNK = 250


def run_jobs(api: httpx.Client, redis: Redis, keys: Keys, count: int, tokens: int, timeout: float = 1800.0) -> None:
    """Submit `count` jobs and wait until every one has ended (done or not)."""
    ended_before = _ended(redis, keys)
    for start in range(0, count, CHUNK):
        body = [{"task": {"kind": "synthetic-trajectory", "tokens": tokens}}] * min(CHUNK, count - start)
        response = api.post("/v1/jobs", json=body)
        response.raise_for_status()
    deadline = time.monotonic() + timeout
    while _ended(redis, keys) < ended_before + count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} jobs did not end within {timeout:.0f}s")
        time.sleep(0.2)
    failed = redis.zcard(keys.jobs_by_status("failed")) + redis.zcard(keys.jobs_by_status("timed_out"))
    if failed:
        raise RuntimeError(f"{failed} jobs did not finish; see the logs")


def _ended(redis: Redis, keys: Keys) -> int:
    return sum(redis.zcard(keys.jobs_by_status(s)) for s in ("done", "failed", "timed_out", "cancelled"))


def used_memory(redis: Redis) -> int:
    return int(redis.info("memory")["used_memory"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="measured jobs")
    parser.add_argument("--warmup", type=int, default=50, help="jobs run before the baseline is taken")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per synthetic trajectory")
    parser.add_argument("--slots", type=int, default=4, help="slots per stage process")
    args = parser.parse_args(argv)

    state_dir = Path(tempfile.mkdtemp(prefix="bench-redis-memory-"))
    settings = Settings(redis_url=None, state_dir=state_dir)
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": args.slots, "rollout": args.slots, "eval": args.slots},
        log_dir=state_dir / "logs",
        extra_env=ENV,
    )
    keys = Keys(settings.redis_prefix)
    with stack:
        stack.wait_for_workers()
        redis = Redis.from_url(stack.redis_url or "")
        with httpx.Client(base_url=stack.api_url, timeout=60) as api:
            run_jobs(api, redis, keys, args.warmup, args.tokens)
            before = used_memory(redis)
            stored_before = api.get("/v1/status").json()["results"]["bytes"]
            run_jobs(api, redis, keys, args.jobs, args.tokens)
            time.sleep(1.0)  # let the last replies and metrics flushes settle
            after = used_memory(redis)
            status = api.get("/v1/status").json()
            sample = redis.zrange(keys.jobs_by_status("done"), -1, -1)[0].decode()
            record = redis.memory_usage(keys.job(sample)) or 0
            limit = status["redis"]["limit_bytes"]
        redis.close()

    per_job = (after - before) / args.jobs
    stored = (status["results"]["bytes"] - stored_before) / args.jobs
    inline = len(pack(synthetic_trajectory("sample", args.tokens)))
    print(f"{args.jobs} jobs of {args.tokens}-token synthetic trajectories, after {args.warmup} warm-up jobs")
    print(f"redis used_memory: {before} -> {after} bytes (maxmemory {limit}); one done record: {record} bytes")
    print(f"results store bytes per job (zstd msgpack, trajectory + evaluation): {stored:.0f}")
    print(f"trajectory msgpack bytes (what each record held in Redis before the results store): {inline}")
    print(f"state and logs: {state_dir}")
    print(f"redis bytes per finished job: {per_job:.0f}")


if __name__ == "__main__":
    main()
