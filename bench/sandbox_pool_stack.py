"""Jobs/s of the `code` kind through the whole stack, with and without the sandbox pool.

The real stack (`cli.stack.Stack`: embedded Redis, the API, init/rollout/eval workers) runs
--jobs jobs of the `code` kind against a scripted backend (tests/support/scripted_llm.py, the
tiny model's tokenizer): each agent runs the starter solution with `python`, then calls
`finish`; eval runs the hidden test in a fresh sandbox. The same jobs run with `sandbox_pool`
off, on (single-use) and on with the code kind's sandboxes reused, each on a stack of its own,
one after the other.
Reported: wall time from the first submission to the last job done, jobs/s, and the rollout
stage's p50 time (from the records' stage timings).

    .venv/bin/python -m bench.sandbox_pool_stack [--jobs 48] [--rollout-concurrency 8] [--modes off single-use reuse]

A benchmark, not a test: it imports the tests' scripted backend and tiny model, as the test
stack does (the tiny model is built on first use, as the tests build it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cli.stack import Stack
from shared.config import Settings

STARTER = "def solve(n):\n    return sum(range(n))\n"
MODES = {"off": (False, "single-use"), "single-use": (True, "single-use"), "reuse": (True, "reuse")}  # pool, lifetime


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def run(pool: bool, lifetime: str, jobs: int, concurrency: int, llm: Any, base: Path) -> tuple[float, list[float]]:
    """(wall seconds for all jobs, each job's rollout seconds) on a fresh stack."""
    from tests.support.waiting import client_for, wait_status

    settings = Settings(redis_url=None, state_dir=base / (f"pool-{lifetime}" if pool else "nopool"))
    env = {
        "ROLLOUTS_LLM_HEARTBEAT_TIMEOUT_S": "600",  # the scripted backend does not beat
        "ROLLOUTS_SANDBOX_POOL": "true" if pool else "false",
        "ROLLOUTS_SANDBOX_REQUIRE_ISOLATION": "true",
        "ROLLOUTS_SANDBOX_LIFETIMES": json.dumps({"code": lifetime}),
    }
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": 2, "rollout": concurrency, "eval": 2},
        log_dir=settings.state_dir / "logs",
        extra_env=env,
    )
    stack.start()
    try:
        stack.wait_for_workers()
        api = client_for(stack)
        assert api.post("/v1/backends", json={"url": llm.url, "model": llm.model}).status_code == 201
        body = {
            "task": {
                "kind": "code",
                "prompt": "Return the sum of range(n). [script:code]",
                "starter_code": STARTER,
                "tests": [{"code": "assert solve(10) == 45"}],
            },
            "limits": {"max_turns": 4, "max_tokens": 8000},
            "sampling": {"max_tokens": 200},
        }
        warm = api.post("/v1/jobs", json=body).json()["job_ids"][0]  # teaches the pool the profile
        assert wait_status(api, warm, timeout=600)["status"] == "done"
        began = time.perf_counter()
        ids = [api.post("/v1/jobs", json=body).json()["job_ids"][0] for _ in range(jobs)]
        records = [wait_status(api, job_id, timeout=1200) for job_id in ids]
        wall = time.perf_counter() - began
        bad = [r for r in records if r["status"] != "done" or r["result"]["reward"] != 1.0]
        assert not bad, bad[0].get("error")
        return wall, [_stage_seconds(r, "rollout") for r in records]
    finally:
        stack.stop(timeout=10)


def _stage_seconds(record: dict[str, Any], stage: str) -> float:
    timing = record.get("timings", {}).get(stage, {})
    started, ended = timing.get("started"), timing.get("ended")
    return float(ended) - float(started) if started is not None and ended is not None else float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=48)
    parser.add_argument("--rollout-concurrency", type=int, default=8)
    parser.add_argument(
        "--modes", nargs="+", choices=MODES, default=list(MODES), help="the pool off, on single-use, on with reuse"
    )
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from bench.backends import tiny_model
    from tests.support.scripted_llm import ScriptedLLM

    model = tiny_model()  # the tests' tiny model, built once per user
    llm = ScriptedLLM(AutoTokenizer.from_pretrained(model, local_files_only=True)).start()
    llm.scripts["code"] = [
        _call("python", code="exec(open('solution.py').read()); solve(10)"),
        _call("finish", answer="done"),
    ]
    base = Path(tempfile.mkdtemp(prefix="bstack-"))
    try:
        print("| sandbox pool | jobs | rollout slots | wall s | jobs/s | rollout stage p50 ms |")
        print("|---|---|---|---|---|---|")
        for pool, lifetime in (MODES[mode] for mode in args.modes):
            wall, rollouts = run(pool, lifetime, args.jobs, args.rollout_concurrency, llm, base)
            print(
                f"| {'on, ' + lifetime if pool else 'off'} | {args.jobs} | {args.rollout_concurrency} | {wall:.1f} | "
                f"{args.jobs / wall:.2f} | {statistics.median(rollouts) * 1000:.0f} |",
                flush=True,
            )
    finally:
        llm.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
