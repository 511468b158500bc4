"""Time to fill a DAPO batch: asynchronous replenishment vs synchronous rounds.

Both modes draw the same prompts, in the same order, with the same
per-sample rollout times (seeded lognormal, long-tailed), half of the prompts
uninformative (every sample gets the same reward). Target: 32 informative
groups of 4 samples, 32 groups in flight at most.

- async: one DAPO batch (`min_informative_groups=32, max_groups_in_flight=32`);
  a filtered group is replaced by the next prompt the moment it completes.
- sync: rounds of 32 prompts (an every-prompt batch each); the next round starts
  only when the whole round has ended, until 32 informative groups are in hand.

`--live` (default) runs both through the real service (embedded Redis, API,
one worker process per stage, the dapo_sim kind sleeping for the drawn time).
`--simulate` replays the same draws in a discrete-event model of both policies
(no service overhead) over many seeds, to show the spread.

    .venv/bin/python -m bench.dapo [--repeats 3] [--simulate --seeds 200] [--target 32] [--in-flight 32]
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any

import httpx

from bench.dapo_kind import rollout_seconds, sample_reward
from cli.stack import Stack
from rollouts_client import RolloutClient
from shared.config import Settings


@dataclass(frozen=True)
class Setup:
    target: int = 32
    n_samples: int = 4
    in_flight: int = 32
    prompt_count: int = 256
    uninformative: float = 0.5
    median_s: float = 1.0
    sigma: float = 1.0
    max_s: float = 30.0


def make_prompts(setup: Setup, seed: int) -> list[dict[str, Any]]:
    """Prompts in prompts order; an informative prompt alternates rewards over its samples."""
    rng = Random(seed)
    prompts = []
    for index in range(setup.prompt_count):
        task: dict[str, Any] = {
            "kind": "dapo_sim",
            "id": f"s{seed}-p{index}",
            "lognormal": {"median_s": setup.median_s, "sigma": setup.sigma, "seed": seed, "max_s": setup.max_s},
        }
        if rng.random() < setup.uninformative:
            task["reward"] = float(rng.random() < 0.5)
        else:
            task["rewards"] = [float((index + i) % 2) for i in range(setup.n_samples)]
        prompts.append(task)
    return prompts


def group_seconds(task: dict[str, Any], n_samples: int) -> float:
    return max(rollout_seconds(task, i) for i in range(n_samples))


def informative(task: dict[str, Any], n_samples: int) -> bool:
    rewards = [sample_reward(task, i) for i in range(n_samples)]
    return max(rewards) != min(rewards)


# --- discrete-event model -------------------------------------------------------------
def simulate_async(prompts: list[dict[str, Any]], setup: Setup) -> float:
    running: list[tuple[float, int]] = []
    cursor, used = 0, 0
    for cursor in range(min(setup.in_flight, len(prompts))):
        heapq.heappush(running, (group_seconds(prompts[cursor], setup.n_samples), cursor))
    cursor += 1
    while running:
        now, k = heapq.heappop(running)
        used += informative(prompts[k], setup.n_samples)
        if used >= setup.target:
            return now
        if cursor < len(prompts):
            heapq.heappush(running, (now + group_seconds(prompts[cursor], setup.n_samples), cursor))
            cursor += 1
    raise RuntimeError("prompts exhausted")


def simulate_sync(prompts: list[dict[str, Any]], setup: Setup) -> tuple[float, int]:
    """(seconds, rounds)."""
    now, used, start, rounds = 0.0, 0, 0, 0
    while used < setup.target:
        round_ = prompts[start : start + setup.in_flight]
        if not round_:
            raise RuntimeError("prompts exhausted")
        now += max(group_seconds(task, setup.n_samples) for task in round_)
        used += sum(informative(task, setup.n_samples) for task in round_)
        start += setup.in_flight
        rounds += 1
    return now, rounds


# --- live -------------------------------------------------------------------------------
def run_async(client: RolloutClient, prompts: list[dict[str, Any]], setup: Setup) -> dict[str, float]:
    started = time.monotonic()
    batch = client.submit_batch(
        prompts, n_samples=setup.n_samples, min_informative_groups=setup.target, max_groups_in_flight=setup.in_flight
    )
    first = None
    for _ in client.iter_groups(batch.id, results=False):
        first = first if first is not None else time.monotonic() - started
    elapsed = time.monotonic() - started
    final = client.get_batch(batch.id)
    assert final.status == "completed" and final.counts.used == setup.target, final
    return {"seconds": elapsed, "first_group_s": first or 0.0, "groups": final.counts.launched}


def run_sync(client: RolloutClient, prompts: list[dict[str, Any]], setup: Setup) -> dict[str, float]:
    started = time.monotonic()
    used, start, rounds, first = 0, 0, 0, None
    while used < setup.target:
        round_ = prompts[start : start + setup.in_flight]
        batch = client.submit_batch(round_, n_samples=setup.n_samples, max_groups_in_flight=setup.in_flight)
        final = client.wait_batch(batch.id)
        first = first if first is not None else time.monotonic() - started
        used += final.counts.informative
        start += setup.in_flight
        rounds += 1
    # a round's groups only reach the trainer when the round ends (the synchronous loop's contract)
    return {"seconds": time.monotonic() - started, "first_group_s": first or 0.0, "groups": start, "rounds": rounds}


def settle(api_url: str) -> None:
    """Wait until no job is in flight (cancelled leftovers of the last run have stopped)."""
    while httpx.get(f"{api_url}/v1/status", timeout=10).json()["in_flight"]:
        time.sleep(0.2)


def live(setup: Setup, repeats: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(redis_url=None, state_dir=Path(tmp) / "state")
        slots = setup.in_flight * setup.n_samples
        env = {"ROLLOUTS_TASK_MODULES": "bench.dapo_kind", "ROLLOUTS_LOG_LEVEL": "WARNING"}
        concurrency = {"init": 16, "rollout": slots, "eval": 16}
        with Stack(settings, api_port=0, concurrency=concurrency, log_dir=Path(tmp) / "logs", extra_env=env) as stack:
            stack.wait_for_workers(timeout=120)
            with RolloutClient(stack.api_url) as client:
                for seed in range(repeats):
                    prompts = make_prompts(setup, seed)
                    for mode, runner in (("async", run_async), ("sync", run_sync)):
                        settle(stack.api_url)
                        result = runner(client, prompts, setup)
                        model = simulate_async(prompts, setup) if mode == "async" else simulate_sync(prompts, setup)[0]
                        rows.append({"seed": seed, "mode": mode, "model_s": model, **result})
                        print(rows[-1], flush=True)
    return rows


def simulate(setup: Setup, seeds: int) -> None:
    asyncs, syncs, rounds = [], [], []
    for seed in range(seeds):
        prompts = make_prompts(setup, seed)
        asyncs.append(simulate_async(prompts, setup))
        sync_s, sync_rounds = simulate_sync(prompts, setup)
        syncs.append(sync_s)
        rounds.append(sync_rounds)
    ratios = sorted(s / a for s, a in zip(syncs, asyncs))
    print(
        f"simulated, {seeds} seeds: async mean {statistics.mean(asyncs):.1f}s, "
        f"sync mean {statistics.mean(syncs):.1f}s ({statistics.mean(rounds):.2f} rounds); "
        f"speed-up median {statistics.median(ratios):.2f}x, p10 {ratios[len(ratios) // 10]:.2f}x, min {ratios[0]:.2f}x"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="Live runs (seeds) of each mode.")
    parser.add_argument("--simulate", action="store_true", help="Only the discrete-event model.")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--median-s", type=float, default=1.0)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--target", type=int, default=32, help="informative groups a batch needs")
    parser.add_argument("--in-flight", type=int, default=32, help="groups in flight at most (a sync round's size)")
    args = parser.parse_args(argv)
    setup = Setup(median_s=args.median_s, sigma=args.sigma, target=args.target, in_flight=args.in_flight)
    simulate(setup, args.seeds)
    if args.simulate:
        return
    rows = live(setup, args.repeats)
    for mode in ("async", "sync"):
        seconds = [r["seconds"] for r in rows if r["mode"] == mode]
        print(f"live {mode}: mean {statistics.mean(seconds):.1f}s over {len(seconds)} runs")
    pairs = [(a["seconds"], s["seconds"]) for a, s in zip(rows[0::2], rows[1::2])]
    print("live speed-up per seed: " + ", ".join(f"{s / a:.2f}x" for a, s in pairs))


if __name__ == "__main__":
    main()
