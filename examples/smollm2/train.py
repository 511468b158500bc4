"""A short GRPO run of SmolLM2 with LoRA through the service: `python -m examples.smollm2 train`.

The loop is grpo.py's (examples/train_grpo's until that moved to TRL's GRPOTrainer): DAPO batches
through rollouts_client, the clipped token-level update, a policy-version check of every turn; with two changes:
the policy is a LoRA adapter on SmolLM2 (lora.py) and a new version reaches vLLM as an
in-place adapter load (`push_adapter`) instead of a checkpoint reload. The task is one-step
arithmetic (arith_rows.py): by default as multiple-choice `stem` rows, graded by the service's
stem kind; `--kind math` as GSM8K rows graded by the math kind.

Writes --out/reward_curve.csv (one row per step) and --out/summary.txt.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from examples.smollm2.arith_rows import arith_task, choice_task
from examples.smollm2.grpo import grpo_step
from examples.smollm2.lora import lora_policy, push_adapter, save_adapter
from examples.smollm2.stack import start_stack
from examples.train_grpo.report import StepRow, summary_text, write_csv
from examples.train_grpo.service import wait_idle
from rollouts_client import RolloutClient

log = logging.getLogger("smollm2")
POLICY = "policy"  # the adapter's served name, and the model the backend is registered under


@dataclass(frozen=True)
class TrainConfig:
    kind: str = "stem"  # stem: multiple choice; math: \boxed{} answers (0 of 32 at step 0: docs/TRAINING.md)
    steps: int = 3  # updates; step `steps` only measures the last policy
    prompts_per_step: int = 4  # groups in flight; the pool holds twice as many for DAPO's replenishment
    min_informative: int = 2
    group_size: int = 4
    lr: float = 3e-4
    clip_eps: float = 0.2
    minibatches: int = 2  # whole groups each; more of them bound the activations of the backward pass
    rank: int = 8
    alpha: int = 16
    max_tokens: int = 64  # per turn: a right answer (a letter, or \boxed{12}) takes 2-8
    max_turns: int = 2
    seed: int = 0
    threads: int = 2
    rollout_slots: int = 4
    batch_timeout_s: float = 900.0


def parse(argv: list[str]) -> TrainConfig:
    parser = argparse.ArgumentParser(prog="python -m examples.smollm2 train [--out DIR]")
    for f in fields(TrainConfig):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = parser.parse_args(argv)
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})


def main(model_dir: Path, out: Path, config: TrainConfig) -> int:
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = lora_policy(model_dir, config.rank, config.alpha)
    first = save_adapter(model, out / "adapters" / "v0")  # the identity: B = 0
    stack = start_stack(out / "stack", model_dir, rollout_slots=config.rollout_slots, adapter=(POLICY, first))
    try:
        with RolloutClient(stack.api_url, token=stack.settings.token) as client:
            rows = train(client, model, tokenizer.pad_token_id, config, out)
    finally:
        stack.stop()
    summary = summary_text(rows) + f"\nwall time {time.perf_counter() - started:.0f}s\n"
    (out / "summary.txt").write_text(summary)
    print(summary)
    return 0


def train(client: RolloutClient, model: Any, pad_token_id: int, config: TrainConfig, out: Path) -> list[StepRow]:
    """`config.steps` GRPO updates, each followed by an adapter push; one CSV row per step."""
    rng = random.Random(config.seed)
    task = {"stem": choice_task, "math": arith_task}[config.kind]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0, betas=(0.9, 0.99))
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": config.max_tokens}
    limits = {"max_turns": config.max_turns, "max_tokens": 3072}
    rows: list[StepRow] = []
    for step in range(config.steps + 1):
        version = f"v{step}"
        adapter = save_adapter(model, out / "adapters" / version)
        wait_idle(client)
        push_adapter(client, adapter, version, POLICY)
        prompts = [{"task": task(rng), "limits": limits} for _ in range(2 * config.prompts_per_step)]
        row, _ = grpo_step(
            client,
            model,
            optimizer,
            config,
            step=step,
            version=version,
            prompts=prompts,
            sampling=sampling,
            pad_token_id=pad_token_id,
            last=step == config.steps,
        )
        rows.append(row)
        write_csv(rows, out / "reward_curve.csv")
        log.info(
            "step %d: reward %.3f over %d samples (%d informative, %d filtered, %d failed groups), loss %.4f, "
            "clip %.3f, |dlogp| %.2g, rollout %.0fs, train %.0fs",
            step,
            row.mean_reward,
            row.samples,
            row.informative_groups,
            row.filtered_groups,
            row.failed_groups,
            row.loss,
            row.clip_fraction,
            row.logprob_gap,
            row.rollout_s,
            row.train_s,
        )
    return rows
