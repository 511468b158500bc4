"""A burst of mixed jobs (examples/mixed.jsonl, math, STEM, code, SWE) through the whole stack, per sandbox settings.

Each configuration is a set of settings (environment variables) on a fresh stack (`cli.stack.Stack`:
embedded Redis, the API, one init, rollout and eval worker with their default slots, as `rollouts up`
starts them); all the jobs are submitted at once. Configurations run interleaved, round after round, so
a busy host weighs on each alike; the table gives each one's median over the rounds and its ratio to the
first configuration.

The model: `--llm vllm` (default) is the tiny model on vLLM's CPU build, as in the issue that asked for
this (it makes no tool call: every job answers in text), started here or named by `--backend-url`;
`--llm scripted` is the tests' scripted backend (tests/support/scripted_llm.py) answering in text at once,
which leaves only the stack's own costs; with `--tool-every N` every Nth job first calls `python` once.

Per kind: wall seconds from the first submission to that kind's last job done, jobs/s (all kinds), the
rollout stage's median and p90, the share of the rollout stage outside the LLM and the tools (from the
trajectory's timings: 1 - (llm_s + tools_s) / stage seconds, over the kind's jobs together) and the eval
stage's queue wait (median).

    .venv/bin/python -m bench.sandbox_burst [--repeat 12] [--rounds 1] [--llm vllm|scripted]
        [--configs old pool-cap2 pool-cap8 new] [--settle 15] [--backend-url URL]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.backends import SERVED_NAME, add_backend_option, tiny_model, vllm_urls
from cli.stack import Stack
from shared.config import Settings

MIXED = Path(__file__).resolve().parent.parent / "examples" / "mixed.jsonl"
_UNCAPPED = "1000"
# The settings that matter, as environment variables. "old" is commit cf7e670's defaults (no pool, no start
# cap, the sandbox started with the rollout); "pool-cap2" the defaults the issue measured (pool on, cap 2).
CONFIGS: dict[str, dict[str, str]] = {
    "old": {
        "ROLLOUTS_SANDBOX_POOL": "false",
        "ROLLOUTS_SANDBOX_START_CONCURRENCY": _UNCAPPED,
        "ROLLOUTS_SANDBOX_START_CONCURRENCY_PER_IMAGE": _UNCAPPED,
        "ROLLOUTS_SANDBOX_ON_DEMAND": "false",
        "ROLLOUTS_EVAL_CONCURRENCY": "4",
    },
    "pool-cap2": {
        "ROLLOUTS_SANDBOX_POOL": "true",
        "ROLLOUTS_SANDBOX_START_CONCURRENCY": "2",
        "ROLLOUTS_SANDBOX_START_CONCURRENCY_PER_IMAGE": "2",
        "ROLLOUTS_SANDBOX_ON_DEMAND": "false",
        "ROLLOUTS_EVAL_CONCURRENCY": "4",
    },
    "pool-cap8": {
        "ROLLOUTS_SANDBOX_POOL": "true",
        "ROLLOUTS_SANDBOX_START_CONCURRENCY": "8",
        "ROLLOUTS_SANDBOX_START_CONCURRENCY_PER_IMAGE": "8",
        "ROLLOUTS_SANDBOX_ON_DEMAND": "false",
        "ROLLOUTS_EVAL_CONCURRENCY": "4",
    },
    "new": {},  # this checkout's defaults
    "new-eval4": {"ROLLOUTS_EVAL_CONCURRENCY": "4"},
    "new-pool-off": {"ROLLOUTS_SANDBOX_POOL": "false"},
}
_TEXT_FIELD = {"math": "problem", "stem": "question", "code": "prompt", "swe": "problem_statement"}


@dataclass
class Run:
    """One burst on one configuration: its wall time and the finished records."""

    wall: float
    began: float
    records: list[dict[str, Any]]


def burst_bodies(repeat: int, scripted: bool, tool_every: int) -> list[dict[str, Any]]:
    """examples/mixed.jsonl `repeat` times over; for the scripted backend each prompt names its script."""
    rows = [json.loads(line) for line in MIXED.read_text().splitlines() if line.strip()]
    bodies = []
    for i in range(repeat * len(rows)):
        body = json.loads(json.dumps(rows[i % len(rows)]))
        if scripted:
            task = body["task"]
            script = "tools" if tool_every and i % tool_every == 0 else "answer"
            task[_TEXT_FIELD[task["kind"]]] += f" [script:{script}]"
        bodies.append(body)
    return bodies


def run_burst(
    name: str, env: dict[str, str], bodies: list[dict[str, Any]], llm: tuple[str, str], base: Path, settle: float = 0.0
) -> Run:
    """All of `bodies` submitted at once to a fresh stack under `env`, `settle` seconds after its backend was
    registered; waits for every one to end."""
    from tests.support.waiting import client_for, wait_status

    settings = Settings(redis_url=None, state_dir=Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base)))
    extra = {"ROLLOUTS_LLM_HEARTBEAT_TIMEOUT_S": "600", "ROLLOUTS_SANDBOX_REQUIRE_ISOLATION": "true", **env}
    stack = Stack(settings, api_port=0, log_dir=settings.state_dir / "logs", extra_env=extra)
    stack.start()
    try:
        stack.wait_for_workers()
        api = client_for(stack)
        assert api.post("/v1/backends", json={"url": llm[0], "model": llm[1]}).status_code == 201
        time.sleep(settle)
        began = time.time()
        response = api.post("/v1/jobs", json=bodies)
        assert response.status_code in (200, 201, 202), response.text
        ids = response.json()["job_ids"]
        records = [wait_status(api, job_id, timeout=1800) for job_id in ids]
        wall = time.time() - began
        bad = [r for r in records if r["status"] != "done"]
        assert not bad, f"{len(bad)} jobs not done, e.g. {bad[0]['status']}: {bad[0].get('error')}"
        return Run(wall, began, records)
    finally:
        stack.stop(timeout=10)
        shutil.rmtree(settings.state_dir, ignore_errors=True)


def _stage(record: dict[str, Any], stage: str, start: str = "started", end: str = "ended") -> float:
    timing = record.get("timings", {}).get(stage, {})
    first, last = timing.get(start), timing.get(end)
    return float(last) - float(first) if first is not None and last is not None else float("nan")


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def per_kind(run: Run) -> dict[str, dict[str, float]]:
    """Each kind's figures in one run (see the module's docstring)."""
    out: dict[str, dict[str, float]] = {}
    kinds = sorted({r["kind"] for r in run.records})
    for kind in kinds:
        mine = [r for r in run.records if r["kind"] == kind]
        rollout = [_stage(r, "rollout") for r in mine]
        inside = [_inside(r) for r in mine]
        ended = [float(r["timings"]["eval"]["ended"]) for r in mine]
        out[kind] = {
            "wall": max(ended) - run.began,
            "rollout_p50": statistics.median(rollout),
            "rollout_p90": _p90(rollout),
            "outside": 1 - sum(inside) / sum(rollout),
            "eval_wait": statistics.median(_stage(r, "eval", "queued", "started") for r in mine),
        }
    return out


def _inside(record: dict[str, Any]) -> float:
    """Seconds of the rollout spent in the LLM and the tools (the trajectory's own timings)."""
    timings = (record.get("result") or {}).get("trajectory", {}).get("timings", {})
    return float(timings.get("llm_s", 0.0)) + float(timings.get("tools_s", 0.0))


def summarize(runs: list[Run]) -> dict[str, Any]:
    """A configuration's medians over its rounds: wall, jobs/s and each kind's figures."""
    kinds = [per_kind(run) for run in runs]
    return {
        "wall": statistics.median(r.wall for r in runs),
        "jobs_s": statistics.median(len(r.records) / r.wall for r in runs),
        "kinds": {
            kind: {key: statistics.median(k[kind][key] for k in kinds) for key in kinds[0][kind]} for kind in kinds[0]
        },
    }


def report(names: list[str], results: dict[str, dict[str, Any]], jobs: int, rounds: int) -> None:
    """The table: one row per configuration and kind, ratios to the first configuration."""
    first = results[names[0]]
    print(f"{jobs} jobs at once, median of {rounds} round(s); ratios are to {names[0]!r}")
    print("| config | wall s | jobs/s | x jobs/s | kind | kind wall s | rollout p50 s | rollout p90 s "
          "| outside LLM+tools | eval queue wait p50 s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        res = results[name]
        for kind, fig in res["kinds"].items():
            print(
                f"| {name} | {res['wall']:.1f} | {res['jobs_s']:.2f} | {res['jobs_s'] / first['jobs_s']:.2f} "
                f"| {kind} | {fig['wall']:.1f} | {fig['rollout_p50']:.2f} | {fig['rollout_p90']:.2f} "
                f"| {fig['outside'] * 100:.0f}% | {fig['eval_wait']:.2f} |",
                flush=True,
            )


def _scripted_backend(tool_every: int) -> Any:
    from transformers import AutoTokenizer

    from tests.support.scripted_llm import ScriptedLLM

    llm = ScriptedLLM(AutoTokenizer.from_pretrained(tiny_model(), local_files_only=True)).start()
    llm.scripts["answer"] = ["The answer is 42."]
    call = json.dumps({"name": "python", "arguments": {"code": "6 * 7"}})
    llm.scripts["tools"] = [f"<tool_call>{call}</tool_call>", "The answer is 42."]
    return llm


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=12, help="examples/mixed.jsonl this many times over")
    parser.add_argument("--rounds", type=int, default=1, help="each configuration this many times, interleaved")
    parser.add_argument("--llm", choices=("vllm", "scripted"), default="vllm")
    parser.add_argument("--tool-every", type=int, default=0, help="scripted: every Nth job calls python once")
    parser.add_argument(
        "--settle",
        type=float,
        default=15.0,
        help="seconds from the stack's start to the burst: `rollouts up` gives its workers its vLLM's start "
        "(60-80 s) to warm up (Stage.warm_up); 0 submits the moment the workers registered",
    )
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=["old", "pool-cap2", "pool-cap8", "new"])
    add_backend_option(parser)
    args = parser.parse_args(argv)
    bodies = burst_bodies(args.repeat, args.llm == "scripted", args.tool_every)
    base = Path(tempfile.mkdtemp(prefix="burst-"))
    runs: dict[str, list[Run]] = {name: [] for name in args.configs}
    try:
        if args.llm == "scripted":
            llm = _scripted_backend(args.tool_every)
            try:
                _rounds(args, runs, bodies, (llm.url, llm.model), base)
            finally:
                llm.stop()
        else:
            with vllm_urls(args.backend_url, 1, base) as urls:
                _rounds(args, runs, bodies, (urls[0], SERVED_NAME), base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(args.configs, {name: summarize(done) for name, done in runs.items()}, len(bodies), args.rounds)


def _rounds(
    args: argparse.Namespace, runs: dict[str, list[Run]], bodies: list[dict[str, Any]], llm: Any, base: Path
) -> None:
    for round_ in range(args.rounds):
        for name in args.configs:
            run = run_burst(name, CONFIGS[name], bodies, llm, base, args.settle)
            runs[name].append(run)
            print(f"round {round_ + 1} {name}: {run.wall:.1f} s, {len(bodies) / run.wall:.2f} jobs/s", flush=True)


if __name__ == "__main__":
    main()
