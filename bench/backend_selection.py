"""Backend selection: the atomic Lua pick vs a plain non-atomic Python pick, on one Redis.

For 1, 16 and 1,000 backends: latency (p50/p99) of a first pick (new trajectory), of a
sticky call (pinned trajectory), and of a release; throughput with concurrent threads;
and the balance the concurrent run leaves (max - min in-flight over equal backends),
where the non-atomic baseline's read-then-write race shows.

    .venv/bin/python -m bench.backend_selection [--pins 2000] [--threads 8]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

from redis import Redis

from cli.embedded_redis import EmbeddedRedis
from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.keys import Keys


class NaiveSelector:
    """The obvious Python version over the same keys: read the minimum, then write, in separate calls."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    def acquire(self, job_id: str) -> str:
        pinned = self.redis.hget(self.keys.llm_routes, f"j:{job_id}")
        if pinned is not None:
            return pinned.decode()
        [best] = self.redis.zrange(self.keys.backend_load, 0, 0)
        self.redis.zincrby(self.keys.backend_load, 1, best)
        self.redis.hset(self.keys.llm_routes, f"j:{job_id}", best)
        return best.decode()

    def release(self, job_id: str) -> None:
        backend = self.redis.hget(self.keys.llm_routes, f"j:{job_id}")
        if backend is not None:
            self.redis.zincrby(self.keys.backend_load, -1, backend)
            self.redis.hdel(self.keys.llm_routes, f"j:{job_id}")


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] * 1e6, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6


def timed(fn: Callable[[str], object], jobs: list[str]) -> list[float]:
    out = []
    for job in jobs:
        start = time.perf_counter()
        fn(job)
        out.append(time.perf_counter() - start)
    return out


def concurrent(make: Callable[[], object], pins: int, threads: int) -> tuple[float, float]:
    """Pins per second with `threads` clients, each its own connection; returns (rate, seconds)."""
    per_thread = pins // threads
    barrier = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        selector = make()
        barrier.wait()
        for i in range(per_thread):
            selector.acquire(f"c-{t}-{i}")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    return per_thread * threads / elapsed, elapsed


def spread(redis: Redis, keys: Keys, ids: list[str], naive: bool) -> int:
    if naive:
        scores = [redis.zscore(keys.backend_load, i) or 0 for i in ids]
    else:
        scores = [int(v or 0) for v in redis.hmget(keys.backend_inflight, ids)]
    return int(max(scores) - min(scores))


def run(n_backends: int, pins: int, threads: int, url: str) -> dict[str, dict[str, float]]:
    settings = Settings(redis_url=url)
    keys = Keys("bench")
    results: dict[str, dict[str, float]] = {}
    for name in ("lua", "naive"):
        redis = Redis.from_url(url)
        redis.flushall()
        pool = BackendPool(redis, keys, settings)
        ids = [pool.register(f"http://10.1.{i // 250}.{i % 250}:8000", "m").id for i in range(n_backends)]
        selector = pool if name == "lua" else NaiveSelector(redis, keys)
        make = (
            (lambda: BackendPool(Redis.from_url(url), keys, settings))
            if name == "lua"
            else (lambda: NaiveSelector(Redis.from_url(url), keys))
        )
        jobs = [f"j-{i}" for i in range(pins)]
        first = timed(selector.acquire, jobs)
        sticky = timed(selector.acquire, jobs)
        release = timed(selector.release, jobs)
        rate, _ = concurrent(make, pins, threads)
        row = {"spread": spread(redis, keys, ids, name == "naive"), "rate": rate}
        for label, samples in (("first", first), ("sticky", sticky), ("release", release)):
            row[f"{label}_p50"], row[f"{label}_p99"] = percentiles(samples)
        results[name] = row
        redis.close()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pins", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--backends", type=int, nargs="+", default=[1, 16, 1000])
    args = parser.parse_args(argv)
    with EmbeddedRedis() as server:
        print(f"{args.pins} pins per run, {args.threads} threads in the concurrent run; latencies in microseconds")
        print(
            "| backends | method | first pick p50 / p99 | sticky call p50 / p99 | release p50 / p99 "
            "| concurrent pins/s | max-min in-flight after concurrent run |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|")
        for n in args.backends:
            for name, row in run(n, args.pins, args.threads, server.url).items():
                method = "Lua script (atomic)" if name == "lua" else "plain Python (non-atomic)"
                print(
                    f"| {n} | {method} | {row['first_p50']:.0f} / {row['first_p99']:.0f} "
                    f"| {row['sticky_p50']:.0f} / {row['sticky_p99']:.0f} "
                    f"| {row['release_p50']:.0f} / {row['release_p99']:.0f} "
                    f"| {row['rate']:.0f} | {row['spread']} |"
                )


if __name__ == "__main__":
    main()
