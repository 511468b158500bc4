"""`python -m workers.<stage>` and `rollouts worker <stage>`: start one stage's worker process."""

from __future__ import annotations

import argparse

from shared.config import get_settings
from shared.logs import setup_logging
from workers.runtime.process import WorkerProcess


def run_worker(stage: str, concurrency: int | None = None, drain_timeout_s: float = 30.0) -> None:
    settings = get_settings()
    setup_logging(settings)
    WorkerProcess(stage, settings, concurrency=concurrency, drain_timeout_s=drain_timeout_s).run()


def main(stage: str) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m workers.{stage}", description=f"Run a {stage}-stage worker.")
    parser.add_argument("--concurrency", type=int, default=None, help="jobs in flight (default: from settings)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish jobs on SIGTERM")
    args = parser.parse_args()
    run_worker(stage, args.concurrency, args.drain_timeout)
