"""What the verl bridge adds per trajectory, against a trainer's own glue on the plain client, side by side.

A stack (embedded Redis, API, one worker per stage) whose one backend is the stand-in LLM
(tests/support/standin_llm.py: a two-turn episode in 50-100 ms, no model), so the service's time per
job is short and the bridge's share shows. bench/trainer_bridges_driver.py runs in the trainers'
virtualenv (scripts/setup.sh) and alternates verl's `_run_agent_loop` on our loop with the plain
client's submit-and-wait, `--concurrency` at a time, then verl V1's agent-loop manager on the same number
of trajectories as one batch (into TransferQueue, on a local Ray); each sample is the call's wall time minus
the job's own time on the service. Reports p50/p99 of each and the split's cost per 1k tokens (goal: bridge
p50 < 15 ms, p99 < 60 ms).

    .venv/bin/python -m bench.trainer_bridges [--trajectories 200] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench.backends import tiny_model
from cli.embedded_redis import free_port
from cli.stack import Stack
from shared.config import Settings
from tests.support.standin_llm import StandinProcess
from tests.support.trainers_env import REPO, trainers_python


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=200, help="per path")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    model = tiny_model()
    with tempfile.TemporaryDirectory(prefix="bench-trainers-") as tmp:
        root = Path(tmp)
        llm = StandinProcess(model, free_port(), (0.05, 0.1), root / "standin.log", model="tiny").wait_healthy()
        stack = Stack(
            Settings(redis_url=None, state_dir=root / "state"),
            api_port=0,
            log_dir=root / "logs",
            concurrency={"init": 4, "rollout": 16, "eval": 4},
            backend_urls=[llm.url],
            extra_env={"ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds"},
        )
        try:
            stack.start()
            stack.wait_for_workers()
            out = root / "out.json"
            env = {
                **os.environ,
                "ROLLOUTS_API_URL": stack.api_url,
                "PYTHONPATH": str(REPO / "client"),
                "ROLLOUTS_RUN_ID": f"bench-{os.getpid()}",
            }
            subprocess.run(
                [
                    str(trainers_python()),
                    str(REPO / "bench" / "trainer_bridges_driver.py"),
                    str(model),
                    str(out),
                    str(args.trajectories),
                    str(args.concurrency),
                ],
                env=env,
                check=True,
                capture_output=True,
            )
            result = json.loads(out.read_text())
        finally:
            stack.stop(timeout=10)
            llm.stop()
    print(
        f"{args.trajectories} trajectories per path, {args.concurrency} at a time, "
        f"{result['mean_tokens']:.0f} tokens each on average"
    )
    print(f"{'path':8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for path, values in result["overheads"].items():
        ms = [v * 1000 for v in values]
        print(f"{path:8} {percentile(ms, 0.5):8.1f} {percentile(ms, 0.99):8.1f} {statistics.mean(ms):8.1f}")
    bridge, client = (percentile(result["overheads"][k], 0.5) for k in ("bridge", "client"))
    print(f"bridge p50 / client p50: {bridge / client:.2f}")
    manager = percentile(result["overheads"]["manager"], 0.5)
    print(f"manager p50 / client p50: {manager / client:.2f} (one batch of {args.trajectories}, not 8 at a time)")
    print(f"split + AgentLoopOutput: {result['split_s_per_1k_tokens'] * 1e3:.3f} ms per 1k tokens")


if __name__ == "__main__":
    main()
