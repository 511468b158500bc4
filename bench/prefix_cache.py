"""Prefix-cache effect of sticky routing vs random routing, on real CPU backends over HTTP.

Starts two CPU backends, then runs the same multi-turn trajectories twice: once routed by
the pool (every turn of a trajectory on its pinned backend) and once with each turn sent
to a random backend. Each turn sends the full token prefix (prompt, earlier turns,
observations), as the agent loop does. Reports the time per turn by turn index and the
share of prompt tokens the backend found in its KV prefix cache.

    .venv/bin/python -m bench.prefix_cache [--trajectories 6] [--turns 10]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from redis import Redis

from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.embedded_redis import EmbeddedRedis, free_port
from shared.keys import Keys
from workers.rollout.llm_client import LLMClient, Sampling

REPO = Path(__file__).resolve().parents[1]


def start_backends(n: int, state_dir: Path, max_len: int) -> list[tuple[str, subprocess.Popen[bytes]]]:
    procs = []
    for _ in range(n):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "cpu_backend", "--port", str(port), "--state-dir", str(state_dir),
             "--max-model-len", str(max_len)],
            cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        procs.append((f"http://127.0.0.1:{port}", proc))
    for url, proc in procs:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"backend {url} did not start")
            time.sleep(0.2)
    return procs


def trajectory_turns(seed: int, system_tokens: int, turns: int, observation_tokens: int) -> tuple[list[int], list[list[int]]]:
    """A synthetic prompt and per-turn observations (byte tokens), different for every trajectory."""
    rng = random.Random(seed)
    prompt = [257] + [rng.randrange(32, 127) for _ in range(system_tokens)] + [258, 10, 257, 10]
    observations = [[258, 10, 257] + [rng.randrange(32, 127) for _ in range(observation_tokens)] + [258, 10, 257, 10]
                    for _ in range(turns)]
    return prompt, observations


def run(mode: str, pool: BackendPool, urls: dict[str, str], client: LLMClient, args: argparse.Namespace,
        rng: random.Random) -> tuple[list[list[float]], float]:
    """All trajectories, turn by turn interleaved (as concurrent rollouts would); returns per-turn times."""
    per_turn: list[list[float]] = [[] for _ in range(args.turns)]
    cached = prompt_total = 0
    state = {}
    for t in range(args.trajectories):
        prompt, observations = trajectory_turns(2 * t + (mode == "sticky"), args.system_tokens, args.turns,
                                                args.observation_tokens)
        state[t] = (prompt, observations)
    for turn in range(args.turns):
        for t in range(args.trajectories):
            history, observations = state[t]
            if mode == "sticky":
                backend_id = pool.acquire(f"{mode}-{t}").backend_id
            else:
                backend_id = rng.choice(sorted(urls))
            sampling = Sampling(max_tokens=args.gen_tokens, seed=turn, ignore_eos=True)
            start = time.perf_counter()
            out = client.complete(urls[backend_id], history, sampling, backend_id=backend_id)
            per_turn[turn].append(time.perf_counter() - start)
            cached += out.cached_tokens or 0
            prompt_total += out.prompt_tokens
            state[t] = (history + out.token_ids + observations[turn], observations)
    for t in range(args.trajectories):
        pool.release(f"{mode}-{t}")
    return per_turn, cached / max(prompt_total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--system-tokens", type=int, default=1200)
    parser.add_argument("--observation-tokens", type=int, default=200)
    parser.add_argument("--gen-tokens", type=int, default=16)
    args = parser.parse_args()
    max_len = 1 + args.system_tokens + 4 + args.turns * (args.gen_tokens + args.observation_tokens + 7) + 64
    with tempfile.TemporaryDirectory() as state_dir, EmbeddedRedis() as server:
        procs = start_backends(args.backends, Path(state_dir), max_len)
        try:
            settings = Settings(redis_url=server.url)
            pool = BackendPool(Redis.from_url(server.url), Keys("bench"), settings)
            urls = {pool.register(url, "tiny").id: url for url, _ in procs}
            rng = random.Random(0)
            with LLMClient() as client:
                run("warmup", pool, urls, client, argparse.Namespace(**{**vars(args), "turns": 1,
                                                                        "trajectories": 1}), rng)
                results = {mode: run(mode, pool, urls, client, args, rng) for mode in ("random", "sticky")}
        finally:
            for _, proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
    print(f"{args.backends} CPU backends, {args.trajectories} trajectories x {args.turns} turns, "
          f"{args.system_tokens}-token prompt, +{args.gen_tokens} generated +{args.observation_tokens} observed "
          "per turn; mean ms per turn")
    print("| turn | " + " | ".join(str(i + 1) for i in range(args.turns)) + " | all turns | prompt tokens cached |")
    print("|---|" + "---:|" * (args.turns + 2))
    for mode in ("random", "sticky"):
        per_turn, hit = results[mode]
        means = [statistics.mean(ts) * 1000 for ts in per_turn]
        overall = statistics.mean([t for ts in per_turn for t in ts]) * 1000
        label = "random routing" if mode == "random" else "sticky (pool)"
        print(f"| {label} | " + " | ".join(f"{m:.0f}" for m in means) + f" | {overall:.0f} | {hit:.0%} |")


if __name__ == "__main__":
    main()
