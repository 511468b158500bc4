"""Prefix-cache effect of sticky routing vs random routing, on real vLLM servers over HTTP.

Starts two vLLM servers (the CPU build on the tiny model, as `rollouts up` starts them), then
runs the same kind of multi-turn trajectories twice: once routed by the pool (every turn of a
trajectory on its pinned backend) and once with each turn sent to a random backend. Each turn
sends the full token prefix (prompt, earlier turns, observations), as the agent loop does.
Reports the time per turn by turn index and the share of prompt tokens vLLM found in its
prefix cache, from vLLM's own counters (GET /metrics: vllm:prefix_cache_queries_total and
vllm:prefix_cache_hits_total, in tokens).

    .venv/bin/python -m bench.prefix_cache [--backends 2] [--trajectories 8] [--turns 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from redis import Redis

from bench.backends import add_backend_option, vllm_urls
from cli.embedded_redis import EmbeddedRedis
from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.keys import Keys
from workers.rollout.llm_client import LLMClient
from workers.rollout.llm_completion import Sampling

PREFIX_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    """(queried, hit) prompt tokens of vLLM's prefix cache, summed over the servers."""
    totals = dict.fromkeys(PREFIX_COUNTERS, 0.0)
    for url in urls:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
    return totals[PREFIX_COUNTERS[0]], totals[PREFIX_COUNTERS[1]]


def trajectory_turns(
    seed: int, system_tokens: int, turns: int, observation_tokens: int
) -> tuple[list[int], list[list[int]]]:
    """A synthetic prompt and per-turn observations (byte tokens), different for every trajectory."""
    rng = random.Random(seed)
    prompt = [257] + [rng.randrange(32, 127) for _ in range(system_tokens)] + [258, 10, 257, 10]
    observations = [
        [258, 10, 257] + [rng.randrange(32, 127) for _ in range(observation_tokens)] + [258, 10, 257, 10]
        for _ in range(turns)
    ]
    return prompt, observations


def run(
    mode: str,
    pool: BackendPool,
    urls: dict[str, str],
    client: LLMClient,
    args: argparse.Namespace,
    rng: random.Random,
    round_: int = 0,
) -> tuple[list[list[float]], float]:
    """All trajectories, turn by turn interleaved (as concurrent rollouts would); returns per-turn times."""
    per_turn: list[list[float]] = [[] for _ in range(args.turns)]
    queried_before, hit_before = prefix_counters(list(urls.values()))
    state = {}
    for t in range(args.trajectories):
        seed = 1000 * round_ + 2 * t + (mode == "sticky")
        prompt, observations = trajectory_turns(seed, args.system_tokens, args.turns, args.observation_tokens)
        state[t] = (prompt, observations)
    for turn in range(args.turns):
        for t in range(args.trajectories):
            history, observations = state[t]
            if mode == "sticky":
                backend_id = pool.acquire(f"{mode}-{round_}-{t}").backend_id
            else:
                backend_id = rng.choice(sorted(urls))
            sampling = Sampling(max_tokens=args.gen_tokens, seed=turn, ignore_eos=True)
            start = time.perf_counter()
            out = client.complete(urls[backend_id], history, sampling, model="tiny", backend_id=backend_id)
            per_turn[turn].append(time.perf_counter() - start)
            state[t] = (history + out.token_ids + observations[turn], observations)
    for t in range(args.trajectories):
        pool.release(f"{mode}-{round_}-{t}")
    queried, hit = prefix_counters(list(urls.values()))
    return per_turn, (hit - hit_before) / max(queried - queried_before, 1)


def measure(
    pool: BackendPool, urls: dict[str, str], args: argparse.Namespace
) -> dict[str, tuple[list[list[float]], list[float]]]:
    """A warm-up turn, then `args.rounds` alternating rounds of each mode: per mode, per-turn times and hit shares."""
    rng = random.Random(0)
    with LLMClient() as client:
        warmup = argparse.Namespace(**{**vars(args), "turns": 1, "trajectories": 1})
        run("warmup", pool, urls, client, warmup, rng)
        # Rounds alternate which mode goes first, so load that comes and goes on a shared
        # machine slows both alike; each trajectory set is fresh (never cached before).
        results: dict[str, tuple[list[list[float]], list[float]]] = {
            mode: ([[] for _ in range(args.turns)], []) for mode in ("random", "sticky")
        }
        for round_ in range(args.rounds):
            for mode in ("random", "sticky") if round_ % 2 == 0 else ("sticky", "random"):
                per_turn, hit = run(mode, pool, urls, client, args, rng, round_)
                for turn, times in enumerate(per_turn):
                    results[mode][0][turn].extend(times)
                results[mode][1].append(hit)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backends", type=int, default=2, help="servers to start (with --backend-url: those given)")
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--system-tokens", type=int, default=1200)
    parser.add_argument("--observation-tokens", type=int, default=200)
    parser.add_argument("--gen-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4, help="Alternating rounds of each mode.")
    add_backend_option(parser)
    args = parser.parse_args(argv)
    if 1 + args.system_tokens + 4 + args.turns * (args.gen_tokens + args.observation_tokens + 7) > 4000:
        parser.error("the trajectories would not fit the tiny model's 4096-token context")
    with (
        tempfile.TemporaryDirectory() as work,
        EmbeddedRedis() as server,
        vllm_urls(args.backend_url, args.backends, Path(work), bind_cores=True) as backend_urls,
    ):
        settings = Settings(redis_url=server.url)
        pool = BackendPool(Redis.from_url(server.url), Keys("bench"), settings)
        urls = {pool.register(url, "tiny").id: url for url in backend_urls}
        args.backends = len(urls)
        results = measure(pool, urls, args)
    print(
        f"{args.backends} vLLM servers (CPU build, tiny model), {args.rounds} alternating rounds of "
        f"{args.trajectories} trajectories x {args.turns} turns, "
        f"{args.system_tokens}-token prompt, +{args.gen_tokens} generated +{args.observation_tokens} observed "
        "per turn; median ms per turn"
    )
    print("| turn | " + " | ".join(str(i + 1) for i in range(args.turns)) + " | all turns | prompt tokens cached |")
    print("|---|" + "---:|" * (args.turns + 2))
    for mode in ("random", "sticky"):
        per_turn, hits = results[mode]
        hit = statistics.mean(hits)
        means = [statistics.median(ts) * 1000 for ts in per_turn]
        overall = statistics.median([t for ts in per_turn for t in ts]) * 1000
        label = "random routing" if mode == "random" else "sticky (pool)"
        print(f"| {label} | " + " | ".join(f"{m:.0f}" for m in means) + f" | {overall:.0f} | {hit:.0%} |")


if __name__ == "__main__":
    main()
