"""One seed's run: warm up, then TRL's GRPOTrainer through the service (the client's TRL bridge).

TRL does the optimisation (its GRPO loss, advantages, AdamW); the bridge
(rollouts_client.trainers.trl_rollout) gives it the service's token-exact rollouts and rewards and
loads every optimizer step's policy into the backends. What this module adds is the record of each
generation (`StepRecorder`): the reward curve's row, and two checks that the service sampled from
the policy TRL trains: every turn carries the version pushed before it, and the backend's logprobs
are the trainer's forward pass of the same tokens.
"""

from __future__ import annotations

import logging
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from examples.train_grpo.arith_kind import task_source
from examples.train_grpo.policy import build_policy, build_policy_tokenizer, save_policy
from examples.train_grpo.report import StepRow
from examples.train_grpo.warmup import warm_up
from rollouts_client.trainers.trl_rollout import RolloutsTRL, task_prompt

log = logging.getLogger("train_grpo")
POLICY = "policy"  # the served model's name (service.start_stack)


@dataclass(frozen=True)
class Config:
    steps: int = 8  # generations, each followed by `iterations` optimizer steps on it
    prompts_per_step: int = 8  # prompts per generation, `group_size` samples each
    group_size: int = 4  # small groups, many prompts: products differ in difficulty, and the curve is per step
    iterations: int = 2  # TRL's num_iterations: the second pass is off-policy, so the clip acts
    lr: float = 5e-4
    clip_eps: float = 0.2
    max_digits: int = 1  # operands of exactly this many digits
    problem_pool: int = 0  # 0: a fresh problem every time; N > 0: draw from N fixed ones
    warmup_steps: int = 1600  # at most, for the skill; it stops at warmup_nll (400-650 steps; up to ~1,200 seen)
    warmup_ramp_steps: int = 80  # the skill phase's LR rises linearly over these
    warmup_nll: float = 0.3  # target episode NLL of the skill phase: exp(-0.3) ~ 0.74 of sampled episodes right
    tool_share: float = 0.25  # of the habit phase's episodes: the rest guess
    habit_steps: int = 100
    habit_lr: float = 1e-3  # a fifth of warmup_lr: the habit costs the skill less (docs/TRAINING.md)
    warmup_lr: float = 5e-3
    warmup_batch: int = 16
    hidden: int = 64
    layers: int = 2
    max_tokens: int = 96  # per turn; a 1-digit turn 1 is ~76 tokens
    job_timeout_s: float = 600.0
    keep_checkpoints: int = 2  # the newest checkpoints left in seed<k>/ (each step's is pushed, then older ones go)
    # Sampling at temperature 1 with no top-k/top-p, vLLM's logprobs of the sampled tokens are the trainer's
    # log-softmax of the weights it just loaded: a larger mean gap means the backend serves other weights.
    logprob_tolerance: float = 1e-3


class MixedPolicyVersions(AssertionError):
    """A generation's trajectories were sampled by more than one policy, or not by the one just pushed."""


class BackendLogprobMismatch(AssertionError):
    """The backend's logprobs of the sampled tokens are not the trainer's: it does not serve TRL's weights."""


def train_seed(api_url: str, token: str | None, seed: int, config: Config, out: Path) -> list[StepRow]:
    """Warm-up, then `config.steps` generations of TRL's GRPOTrainer; one row per generation (step 0: the
    warm-up policy's rollouts)."""
    torch.manual_seed(seed)
    tasks = task_source(random.Random(seed), config.max_digits, config.problem_pool)
    tokenizer = build_policy_tokenizer()
    model = build_policy(tokenizer, seed, config.hidden, config.layers)
    started = time.perf_counter()
    losses = warm_up(
        model,
        tokenizer,
        tasks,
        steps=config.warmup_steps,
        batch_size=config.warmup_batch,
        lr=config.warmup_lr,
        lr_ramp_steps=config.warmup_ramp_steps,
        target_nll=config.warmup_nll,
        tool_share=config.tool_share,
        habit_steps=config.habit_steps,
        habit_lr=config.habit_lr,
        rng=random.Random(seed + 1000),
    )
    log.info(
        "seed %d: warm-up %d steps in %.0fs, final episode NLL %.3f",
        seed,
        len(losses),
        time.perf_counter() - started,
        losses[-1] if losses else float("nan"),
    )
    checkpoints = out / f"seed{seed}"
    bridge = RolloutsTRL(
        api_url=api_url,
        token=token,
        model=POLICY,
        run_id=f"train-grpo-{out.name}-s{seed}-{os.getpid()}",
        checkpoint_dir=checkpoints,
        version_prefix=f"s{seed}-",
        save=lambda m, path: save_policy(m, tokenizer, path),  # untied embeddings: what vLLM can reload
        wait_timeout_s=config.job_timeout_s,
        keep_checkpoints=config.keep_checkpoints,
    )
    recorder = StepRecorder(bridge, tokenizer, seed, config)
    rows = Dataset.from_list([{"prompt": task_prompt(tasks())} for _ in range(config.steps * config.prompts_per_step)])
    args = GRPOConfig(
        output_dir=str(checkpoints / "trl"),
        per_device_train_batch_size=config.prompts_per_step * config.group_size,
        num_generations=config.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=config.iterations,
        max_steps=config.steps * config.iterations,
        learning_rate=config.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta2=0.99,
        max_grad_norm=1.0,
        beta=0.0,  # no KL term, no reference model
        epsilon=config.clip_eps,
        loss_type="dapo",  # token-level mean over the batch
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_completion_length=config.max_tokens,  # the bridge's per-turn cap
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,  # float32, as the backend samples: GRPOConfig defaults to bf16 autocast
        seed=seed,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        train_dataset=rows,
        reward_funcs=[bridge.service_reward],
        rollout_func=recorder.rollout_func,
        callbacks=[bridge.weights_callback(), recorder],
    )
    trainer.remove_callback(PrinterCallback)  # TRL's per-step dicts: the recorder logs one line per generation
    try:
        trainer.train()
    finally:
        bridge.close()
    return recorder.rows


class StepRecorder(TrainerCallback):
    """Wraps the bridge's rollout_func: checks each generation and records its row; fills in TRL's loss."""

    def __init__(self, bridge: RolloutsTRL, tokenizer: Any, seed: int, config: Config) -> None:
        self.bridge, self.tokenizer, self.seed, self.config = bridge, tokenizer, seed, config
        self.rows: list[StepRow] = []
        self.rolled_out = 0.0

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        started = time.perf_counter()
        out = self.bridge.rollout_func(prompts, trainer)
        step = int(trainer.state.global_step)
        version = self.bridge.version(step)
        seen = {v for versions in out["rollouts_policy_versions"] for v in versions}
        if seen != {version}:
            raise MixedPolicyVersions(f"step {step}: trajectories from {sorted(seen)}, expected {version}")
        gap = logprob_gap(trainer.model, out)
        if not gap < self.config.logprob_tolerance:  # NaN fails too
            raise BackendLogprobMismatch(
                f"step {step}: mean |vLLM logprob - trainer logprob| {gap:.2e}, tolerance "
                f"{self.config.logprob_tolerance:.0e}"
            )
        rewards = [float(r) for r in out["rollouts_reward"]]
        size = self.config.group_size
        groups = [rewards[i : i + size] for i in range(0, len(rewards), size)]
        tool = ['"python"' in self.tokenizer.decode(ids) for ids in out["completion_ids"]]
        self.rolled_out = time.perf_counter()
        self.rows.append(
            StepRow(
                seed=self.seed,
                step=len(self.rows),
                policy_version=version,
                versions_seen=";".join(sorted(seen)),
                mean_reward=statistics.fmean(rewards),
                tool_rate=sum(tool) / len(tool),
                samples=len(rewards),
                informative_groups=sum(len(set(g)) > 1 for g in groups),
                filtered_groups=0,
                failed_groups=0,
                trained_samples=len(rewards),
                loss=0.0,
                clip_fraction=0.0,
                approx_kl=0.0,
                logprob_gap=gap,
                rollout_s=self.rolled_out - started,
                train_s=0.0,
            )
        )
        row = self.rows[-1]
        log.info(
            "seed %d step %d (%s): reward %.3f (python used %.2f) over %d samples, %d informative groups, "
            "|dlogp| %.1e, rollout %.0fs, retried jobs %d",
            self.seed,
            row.step,
            version,
            row.mean_reward,
            row.tool_rate,
            row.samples,
            row.informative_groups,
            gap,
            row.rollout_s,
            sum(a > 1 for a in out["rollouts_attempts"]),
        )
        return out

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if self.rows and logs and "loss" in logs:  # TRL's loss and clip share, per optimizer step: the last one's
            self.rows[-1].loss = float(logs["loss"])
            self.rows[-1].clip_fraction = float(logs.get("clip_ratio/region_mean", 0.0))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rows:
            self.rows[-1].train_s = time.perf_counter() - self.rolled_out


@torch.no_grad()
def logprob_gap(model: Any, out: dict[str, list[Any]]) -> float:
    """Mean |backend logprob - trainer logprob| over the generated tokens (env_mask 1) of a rollout_func output."""
    gaps: list[torch.Tensor] = []
    for prompt, completion, logprobs, mask in zip(
        out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]
    ):
        ids = torch.tensor([prompt + completion])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        mine = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
        keep = torch.tensor(mask, dtype=torch.bool)
        gaps.append((mine - torch.tensor(logprobs))[keep].abs())
    every = torch.cat(gaps)
    return float(every.mean()) if every.numel() else 0.0
