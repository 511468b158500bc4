"""Rollout throughput as the rollout fleet grows, where the model is not the limit (issue 47, item 6).

The system in our design notes reports rollout throughput growing nearly linearly with nodes. Here each
"node" is a rollout worker process of its own (its own process group, its own Redis connections, `--slots`
rollout slots), 1, 2, 4, 8 and 16 of them in turn, in front of one stand-in vLLM server
(tests/support/standin_llm.py) that answers every turn after a fixed `--turn-s`: the jobs (`agent-answer`,
test_load's scripted 2-4 turns, tests/reliability/test_load.py) wait on the model, so a slot does about
1 / (3 x turn-s) jobs/s whatever the machine, and ideal throughput is linear in the slots. One init and one
eval process (`--stage-slots` each), the API and the embedded Redis stay as they are: what does not scale
with the fleet is what the line bends on.

Per fleet size: `--jobs-per-slot` jobs per rollout slot, all submitted at once; throughput is the steady
rate (the jobs that finished between the 10th and the 90th percentile of finish times, over that span),
against the ideal (slots / mean turns / turn-s) and against 1 process scaled; and the CPU per job of each
process kind (/proc), which says which one runs out first. With `--plot PNG`, the line and the ideal.

    .venv/bin/python -m bench.fleet_scaling [--processes 1 2 4 8 16] [--slots 8] [--turn-s 1.0]
        [--jobs-per-slot 6] [--stage-slots 32] [--plot docs/fleet_scaling.png]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.load import process_kinds, summaries
from bench.process_cpu import cpu_seconds
from cli.embedded_redis import free_port
from cli.stack import Stack
from cli.tiny_model import build_tokenizer
from shared.config import Settings
from tests.reliability.jobs import submit
from tests.reliability.test_load import agent_jobs
from tests.support.standin_llm import StandinProcess

ENV = {"ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds"}  # INFO logs: the workers' "warm-up done" is waited for
MEAN_TURNS = 3.0  # test_load's scripts: 2, 3, 4 turns in turn


def steady_rate(finished: list[float]) -> float:
    """Jobs/s between the 10th and 90th percentile of finish times: the fleet's rate without its ramp and tail."""
    times = sorted(finished)
    low, high = times[len(times) // 10], times[(len(times) * 9) // 10]
    return ((len(times) * 9) // 10 - len(times) // 10) / (high - low) if high > low else 0.0


def run_fleet(processes: int, args: argparse.Namespace, standin: StandinProcess, work: Path) -> dict[str, Any]:
    """One fleet size, on a stack of its own: its steady rate, wall time and CPU per job per process kind."""
    stack = Stack(
        Settings(redis_url=None, state_dir=work / f"state-{processes}"),
        api_port=0,
        concurrency={"init": args.stage_slots, "rollout": args.slots, "eval": args.stage_slots},
        log_dir=work / f"logs-{processes}",
        backend_urls=[standin.url],
        extra_env=ENV,
    )
    stack.start()
    try:
        for _ in range(processes - 1):
            stack.start_worker("rollout")
        stack.wait_for_workers(timeout=120)
        wait_warm(work / f"logs-{processes}", processes)
        jobs = agent_jobs(args.jobs_per_slot * args.slots * processes)
        for i, job in enumerate(jobs):
            job["idempotency_key"] = f"fleet-{processes}-{i}"
        kinds = process_kinds(stack, [standin])
        cpu_before = {kind: sum(cpu_seconds(pid, children=True) for pid in pids) for kind, pids in kinds.items()}
        with httpx.Client(base_url=stack.api_url, timeout=60.0) as api:
            started = time.time()
            ids = submit(api, jobs, chunk=500)
            rows = wait_done(api, ids, timeout=600 + 10 * len(ids) * args.turn_s / (args.slots * processes))
            wall = time.time() - started
        cpu = {
            kind: sum(cpu_seconds(pid, children=True) for pid in pids) - cpu_before[kind]
            for kind, pids in kinds.items()
        }
    finally:
        stack.stop(timeout=20)
    not_done = [row for row in rows.values() if row["status"] != "done"]
    if not_done or len(rows) != len(ids):
        raise RuntimeError(f"{processes} processes: {len(not_done)} of {len(ids)} jobs not done ({len(rows)} seen)")
    return {
        "processes": processes,
        "jobs": len(ids),
        "wall_s": wall,
        "rate": steady_rate([float(row["finished_at"]) for row in rows.values()]),
        "cpu_ms_per_job": {kind: 1000 * seconds / len(ids) for kind, seconds in cpu.items()},
        "load": os.getloadavg()[0],
    }


def wait_warm(logs: Path, processes: int, timeout: float = 300.0) -> None:
    """Until every rollout process has loaded its tokenizer (its log's "warm-up done"): a start's one-off CPU is
    not the fleet's per-job cost."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        warm = [
            (logs / f"rollout-{i}.log").exists() and "warm-up done" in (logs / f"rollout-{i}.log").read_text()
            for i in range(processes)
        ]
        if all(warm):
            return
        time.sleep(0.5)
    raise RuntimeError(f"rollout processes not warm after {timeout:.0f} s (see {logs})")


def wait_done(api: httpx.Client, ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Every job's summary once none is left running (or at `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = summaries(api, ids, chunk=500)
        running = [row for row in rows.values() if row["status"] not in ("done", "failed", "cancelled", "timed_out")]
        if not running or time.monotonic() > deadline:
            return rows
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--slots", type=int, default=8, help="rollout slots per process")
    parser.add_argument("--turn-s", type=float, default=1.0, help="the stand-in's time per turn")
    parser.add_argument("--jobs-per-slot", type=int, default=6)
    parser.add_argument("--stage-slots", type=int, default=32, help="init and eval slots (one process each)")
    parser.add_argument("--plot", type=Path, help="write the line and the ideal to this PNG")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    tokenizer = work / "tokenizer"
    build_tokenizer().save_pretrained(tokenizer)
    standin = StandinProcess(tokenizer, free_port(), (args.turn_s, args.turn_s), work / "standin.log").wait_healthy()
    results = []
    try:
        for processes in args.processes:
            results.append(run_fleet(processes, args, standin, work))
            report(results, args)
    finally:
        standin.stop()
    if args.plot:
        plot(results, args)


def ideal(processes: int, args: argparse.Namespace) -> float:
    return processes * args.slots / (MEAN_TURNS * args.turn_s)


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The table so far (reprinted after each fleet size, so a long run shows its progress)."""
    kinds = ("rollout", "init", "eval", "api", "redis", "stand-in")
    print(
        "\n| processes | slots | jobs | steady jobs/s | ideal | of ideal | vs 1 process x n | "
        + " | ".join(f"{k} ms/job" for k in kinds)
        + " | load avg |"
    )
    print("|---:" * (8 + len(kinds)) + "|")
    base = results[0]["rate"] / results[0]["processes"]
    for r in results:
        n = r["processes"]
        cpu = " | ".join(f"{r['cpu_ms_per_job'].get(k, 0.0):.1f}" for k in kinds)
        print(
            f"| {n} | {n * args.slots} | {r['jobs']} | {r['rate']:.2f} | {ideal(n, args):.2f} | "
            f"{r['rate'] / ideal(n, args):.2f} | {r['rate'] / (base * n):.2f} | {cpu} | {r['load']:.1f} |",
            flush=True,
        )
    total = statistics.fmean(sum(r["cpu_ms_per_job"].values()) for r in results)
    print(f"mean CPU per job, all processes: {total:.1f} ms", flush=True)


def plot(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["processes"] for r in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(
        n,
        [ideal(p, args) for p in n],
        "--",
        label=f"ideal ({args.slots} slots x 1/({MEAN_TURNS:g} x {args.turn_s:g} s))",
    )
    ax.plot(n, [r["rate"] for r in results], "o-", label="measured (steady jobs/s)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n, [str(p) for p in n])
    ax.set_xlabel("rollout worker processes")
    ax.set_ylabel("jobs/s")
    ax.set_title("Rollout throughput vs fleet size (2-core machine)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=100)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
