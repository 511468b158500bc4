"""`python -m workers.<stage>` and `rollouts worker <stage>`: start one stage's worker process."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from shared.config import get_settings
from shared.logs import setup_logging
from workers.runtime.process import WorkerProcess
from workers.sandbox.owner import POOL_DIR, sweep


def run_worker(stage: str, concurrency: int | None = None, drain_timeout_s: float | None = None) -> None:
    settings = get_settings()
    setup_logging(settings)
    drain = settings.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
    sweep(settings.workspaces / POOL_DIR)  # the sandbox directories this node's dead workers left (SANDBOX.md)
    WorkerProcess(stage, settings, concurrency=concurrency, drain_timeout_s=drain).run()
    exit_without_abandoned_calls()


def exit_without_abandoned_calls() -> None:
    """End the process once its jobs are handed back, without waiting for LLM calls that interrupted
    rollouts left running.

    concurrent.futures joins every executor thread at interpreter exit, so a stopped rollout
    worker would wait for each abandoned generation to finish (minutes on a busy backend, up to
    `llm_request_timeout_s`) before it exits; their attempts are handed back already and nobody
    reads their results.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(stage: str) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m workers.{stage}", description=f"Run a {stage}-stage worker.")
    parser.add_argument("--concurrency", type=int, default=None, help="jobs in flight (default: from settings)")
    parser.add_argument("--drain-timeout", type=float, default=None, help="seconds to finish jobs on SIGTERM")
    args = parser.parse_args()
    run_worker(stage, args.concurrency, args.drain_timeout)
