"""`dapo_sim`: a task kind that simulates a rollout for batch tests and the DAPO benchmark.

Loaded by workers through ROLLOUTS_TASK_MODULES=bench.dapo_kind. Its rollout
sleeps (cooperatively, so cancels stop it) for a time given by the task or
drawn from a seeded lognormal distribution (long-tailed, like real agent
rollouts), returns a small but valid token record, and its reward is fixed by
the task per sample index: equal rewards make an uninformative prompt.

Task fields: `rewards` (list, indexed by sample index, cycled) or `reward`
(one value for every sample); `rollout_s` (seconds, or a list per sample) or
`lognormal` {median_s, sigma, seed, max_s}; `fail_samples` (sample indices whose rollout raises);
`hold` {stage: path} (the stage waits until the file exists: bench/hold.py).
"""

from __future__ import annotations

import math
import random
from typing import Any

from bench.hold import hold_stage, validate_hold
from shared.tasks import StageContext, TaskKind, TaskValidationError, register
from shared.trajectory import ASSISTANT, PROMPT, Trajectory, Turn


def rollout_seconds(task: dict[str, Any], sample_index: int) -> float:
    """The simulated rollout time of one sample; deterministic for a given task and sample."""
    fixed = task.get("rollout_s")
    if isinstance(fixed, list):
        return float(fixed[sample_index % len(fixed)])
    if fixed is not None:
        return float(fixed)
    spec = task.get("lognormal")
    if not spec:
        return 0.0
    rng = random.Random(f"{spec.get('seed', 0)}/{task.get('id', '')}/{sample_index}")
    seconds = float(spec["median_s"]) * math.exp(rng.gauss(0.0, float(spec.get("sigma", 1.0))))
    return min(seconds, float(spec.get("max_s", math.inf)))


def sample_reward(task: dict[str, Any], sample_index: int) -> float:
    rewards = task.get("rewards")
    if rewards:
        return float(rewards[sample_index % len(rewards)])
    return float(task.get("reward", 0.0))


def tiny_trajectory(sample_index: int) -> dict[str, Any]:
    """A prompt and one assistant turn whose token ids encode the sample index (for collation checks)."""
    record = Trajectory()
    record.append(Turn(role=PROMPT, start=0, end=0, text="prompt"), [1, 2, 3])
    generated = [10 + sample_index] * (1 + sample_index % 3)
    record.append(Turn(role=ASSISTANT, start=0, end=0, text="answer"), generated, [-0.5] * len(generated))
    record.stop_reason = "finish"
    return record.to_dict()


@register
class DapoSimKind(TaskKind):
    name = "dapo_sim"

    def validate(self, task: dict[str, Any]) -> None:
        rewards = task.get("rewards")
        if rewards is not None and (not isinstance(rewards, list) or not rewards):
            raise TaskValidationError("task.rewards: a non-empty list of numbers (one per sample index, cycled)")
        if task.get("lognormal") is not None and "median_s" not in task["lognormal"]:
            raise TaskValidationError("task.lognormal: needs median_s")
        validate_hold(task)

    def init(self, ctx: StageContext) -> dict[str, Any]:
        hold_stage(ctx)
        return {}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        index = ctx.request.sample_index or 0
        seconds = rollout_seconds(ctx.task, index)
        hold_stage(ctx)
        if seconds > 0:
            ctx.sleep(seconds)
        if index in (ctx.task.get("fail_samples") or []):
            raise RuntimeError(f"dapo_sim: sample {index} fails by request")
        return {**tiny_trajectory(index), "extra": {"slept_s": seconds}}

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        hold_stage(ctx)
        return {"reward": sample_reward(ctx.task, ctx.request.sample_index or 0)}
