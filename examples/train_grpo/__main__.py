"""`python -m examples.train_grpo --out runs/grpo --seeds 3`: TRL's GRPOTrainer on the CPU through the rollout service.

Starts the whole stack locally (cli.stack.Stack: Redis, API, workers, one vLLM server),
then, per seed: warm-up, then TRL's GRPOTrainer with the client's TRL bridge (its rollouts are
the service's jobs, token-exact; its reward the service's; every optimizer step's weights loaded
into the backend), and writes reward_curve.csv, reward_curve.png and summary.txt to --out.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import fields
from pathlib import Path

import torch

from examples.train_grpo.policy import build_policy, build_policy_tokenizer, save_policy
from examples.train_grpo.report import StepRow, plot, summary_text, write_csv
from examples.train_grpo.run import Config, train_seed
from examples.train_grpo.service import start_stack

log = logging.getLogger("train_grpo")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(
        prog="python -m examples.train_grpo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/grpo"))
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds, one after another on one stack")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed+seeds-1")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the trainer")
    parser.add_argument(
        "--rollout-slots",
        type=int,
        default=16,
        help="rollouts at once: more sequences per vLLM step (16 vs 8: batches 30 s vs 40 s on 2 cores)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib)")
    for field in fields(Config):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    args = parser.parse_args(argv)
    config = Config(**{f.name: getattr(args, f.name) for f in fields(Config)})
    return args, config


def main(argv: list[str] | None = None) -> int:
    args, config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16
    torch.set_num_threads(args.threads)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tokenizer = build_policy_tokenizer()
    base = out / "base"
    if not (base / "config.json").exists():  # what the backend serves until the first reload
        save_policy(build_policy(tokenizer, 0, config.hidden, config.layers), tokenizer, base)
    rows: list[StepRow] = []
    stack = start_stack(out, base, args.rollout_slots)
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            rows += train_seed(stack.api_url, stack.settings.token, seed, config, out)
            write_csv(rows, out / "reward_curve.csv")  # after every seed: a cut-short run keeps its data
    finally:
        stack.stop()
    if not args.no_plot:
        plot(rows, out / "reward_curve.png")
    summary = summary_text(rows) + f"\nwall time {time.perf_counter() - started:.0f}s\n"
    (out / "summary.txt").write_text(summary)
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
