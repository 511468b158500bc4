"""TRL's GRPOTrainer backed by the service: a `rollout_func`, the service's reward, weights pushed every step (trl 1.16).

    bridge = RolloutsTRL(model="policy", checkpoint_dir="ckpt", run_id="grpo-1")
    trainer = GRPOTrainer(model=policy, args=GRPOConfig(...), train_dataset=rows,
                          reward_funcs=[bridge.service_reward], rollout_func=bridge.rollout_func,
                          callbacks=[bridge.weights_callback()])

**Rows.** TRL hands `rollout_func` only the rows' `prompt` values (grpo_trainer.py, `_generate`:
`self.rollout_func(prompts, self)`), so the prompt carries the service task: its JSON text (or the
dict) as the `prompt` column, or a chat prompt whose message has a `rollouts_task` field. The kind
renders the real prompt; TRL's text is not sent.

**Groups.** TRL's RepeatSampler repeats each prompt `num_generations` times in a row, so the call's
prompts come in runs of that length: each run is one service group (`group_id`, `sample_index`),
the whole call one submission. A run whose prompts differ raises.

**What TRL gets back**, per row, token-exact from the record (records.split_record): `prompt_ids` =
the first turn's span, `completion_ids` = every later span (assistant and tool tokens), `env_mask`
= the record's loss mask (TRL multiplies it into its loss mask), `logprobs` = the backend's (0.0 on
tool tokens); and, as extra fields TRL hands to the reward functions, `rollouts_reward`,
`rollouts_job_id`, `rollouts_policy_versions`, `rollouts_stop_reason`. `service_reward` returns
`rollouts_reward` as it is: TRL never scores the text. A failed job is retried or raised
(`on_failure`, as the other bridges), never a reward.

**Weights.** `weights_callback()` is a TrainerCallback: at the start of training and after each
optimizer step it saves the policy and loads it into every backend of `model` with the service's
one weight call (`POST /v1/models/{model}/weights`), under the version `<version_prefix>step-<n>`,
before TRL samples again; each job carries that version as `metadata.policy_version`, and every
turn records what really sampled it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from rollouts_client.trainers.records import split_record
from rollouts_client.trainers.rows import TASK_FIELD, RowError, group_id, idempotency_key, sampling_from, task_from
from rollouts_client.trainers.settings import BridgeSettings
from rollouts_client.trainers.waiting import ServiceConnection


def _save_pretrained(model: Any, path: Path) -> None:
    model.save_pretrained(path, safe_serialization=True)


class RolloutsTRL:
    """One TRL run's bridge: `rollout_func`, `service_reward` and `weights_callback()` share its settings.

    `settings`: BridgeSettings' names (`model` is the served model the jobs sample from and the
    callback updates; `max_tokens_per_turn` unset takes GRPOConfig's `max_completion_length`).
    `checkpoint_dir`: where the callback saves each step (`<dir>/<version>`); `keep_checkpoints`
    how many to leave there. `save(model, path)` writes the checkpoint the backends load (default:
    `save_pretrained`; a policy with tied embeddings needs them untied, docs/TRAINING.md).
    """

    def __init__(
        self,
        *,
        checkpoint_dir: str | Path | None = None,
        version_prefix: str = "",
        save: Callable[[Any, Path], None] | None = None,
        keep_checkpoints: int = 2,
        **settings: Any,
    ) -> None:
        self.settings = BridgeSettings.from_mapping(settings)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.version_prefix = version_prefix
        self.save = save or _save_pretrained
        self.keep_checkpoints = keep_checkpoints
        self.loop = asyncio.new_event_loop()  # TRL calls rollout_func synchronously: one loop, one waiter, reused
        self.pushed: list[dict[str, Any]] = []  # the service's answer to every weight push, in order

    def version(self, step: int) -> str:
        """The weight version the policy of optimizer step `step` is pushed as."""
        return f"{self.version_prefix}step-{int(step)}"

    # ---- rollout_func -------------------------------------------------------------------------------------

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's hook: the prompts' tasks as one submission, the records as TRL's fields (module docstring)."""
        started = time.perf_counter()
        training = bool(getattr(trainer.model, "training", True))
        size = trainer.num_generations if training else trainer.num_generations_eval
        step = int(trainer.state.global_step)
        bodies, keys, rows = self.job_bodies(prompts, size, step, "train" if training else "eval", trainer.args)
        results = self.loop.run_until_complete(self._run(bodies, keys, rows))
        splits = [split_record(job, self.settings.on_segments) for job, _ in results]
        jobs = [job for job, _ in results]
        return {
            "prompt_ids": [s.prompt_ids for s in splits],
            "completion_ids": [s.response_ids for s in splits],
            "logprobs": [s.response_logprobs for s in splits],
            "env_mask": [s.response_mask for s in splits],
            "rollouts_reward": [None if job.reward is None else float(job.reward) for job in jobs],
            "rollouts_job_id": [job.id for job in jobs],
            "rollouts_attempts": [attempts for _, attempts in results],
            "rollouts_policy_versions": [
                sorted({str(t["policy_version"]) for t in s.weight_versions if t["policy_version"] is not None})
                for s in splits
            ],
            "rollouts_stop_reason": [s.stop_reason for s in splits],
            "rollouts_bridge_s": [time.perf_counter() - started] * len(splits),
        }

    async def _run(self, bodies: list[dict[str, Any]], keys: list[str], rows: list[str]) -> list[Any]:
        return await ServiceConnection.shared(self.settings).run_jobs(bodies, keys, rows)

    def job_bodies(
        self, prompts: list[Any], size: int, step: int, phase: str, args: Any = None
    ) -> tuple[list[dict[str, Any]], list[str], list[str]]:
        """One job per prompt, runs of `size` as groups; RowError naming the row before anything is sent."""
        if size < 1 or len(prompts) % size:
            raise RowError("*", "prompts", f"{len(prompts)} prompts are not runs of num_generations={size}")
        params = _trl_sampling(args)
        if self.settings.max_tokens_per_turn is not None or params.get("max_tokens") is None:
            params.pop("max_tokens", None)  # the bridge's own cap first, then TRL's max_completion_length
        sampling = sampling_from(params, self.settings.max_tokens_per_turn)
        bodies, keys, rows = [], [], []
        for start in range(0, len(prompts), size):
            run = prompts[start : start + size]
            tasks = [task_of_prompt(p, str(start + i)) for i, p in enumerate(run)]
            if any(t != tasks[0] for t in tasks):
                raise RowError(str(start), "prompt", f"the {size} prompts of a group differ (TRL repeats each one)")
            for index, task in enumerate(tasks):
                body: dict[str, Any] = {
                    "task": task,
                    "sampling": sampling,
                    "group_id": group_id(self.settings.run_id, phase, step, start),
                    "sample_index": index,
                    "metadata": {
                        "trainer": "trl",
                        "global_step": step,
                        "training_phase": phase,
                        "run_id": self.settings.run_id,
                        "policy_version": self.version(step),
                    },
                }
                if self.settings.model:
                    body["model"] = self.settings.model
                bodies.append(body)
                keys.append(idempotency_key(self.settings.run_id, "trl", phase, step, start, index))
                rows.append(str(start + index))
        return bodies, keys, rows

    # ---- the reward --------------------------------------------------------------------------------------

    def service_reward(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        """TRL's reward function: the job's reward as the service's evaluation gave it (None where it gave
        none: TRL then leaves the row to the other reward functions)."""
        rewards = kwargs.get("rollouts_reward")
        if rewards is None:
            raise ValueError("service_reward needs rollout_func=RolloutsTRL.rollout_func (no rollouts_reward given)")
        return list(rewards)

    # ---- weights -----------------------------------------------------------------------------------------

    def weights_callback(self) -> TrainerCallback:
        """The TrainerCallback that pushes the policy at the start and after every optimizer step."""
        return PushWeights(self)

    def push(self, model: Any, step: int) -> dict[str, Any]:
        """Save `model` and load it into every backend of the served model as `version(step)`; raises when a
        backend failed (it has left the pool: sampling on fewer servers, or stale ones, is not what was asked)."""
        if not self.settings.model or self.checkpoint_dir is None:
            raise ValueError("pushing weights needs model (the served model) and checkpoint_dir")
        version = self.version(step)
        final = (self.checkpoint_dir / version).absolute()
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        self.save(model, partial)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        result = self.loop.run_until_complete(self._update_weights(version, final))
        failed = [f"{b['url']}: {b['error']}" for b in result["backends"] if b["status"] != "updated"]
        if failed:
            raise RuntimeError(f"loading {version} into {self.settings.model!r} failed on {'; '.join(failed)}")
        self.pushed.append(result)
        self._prune(final)
        return result

    async def _update_weights(self, version: str, path: Path) -> dict[str, Any]:
        """The service's one weight call, through the bridge's one client (its connection's, on its loop)."""
        assert self.settings.model is not None
        client = ServiceConnection.shared(self.settings).client
        return await client.update_weights(self.settings.model, version, path=str(path))

    def _prune(self, newest: Path) -> None:
        assert self.checkpoint_dir is not None
        older = sorted(
            (p for p in self.checkpoint_dir.glob(f"{self.version_prefix}step-*") if p != newest and p.is_dir()),
            key=lambda p: p.stat().st_mtime,
        )
        for path in older[: max(0, len(older) - self.keep_checkpoints + 1)]:
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        """Close the bridge's client and its event loop."""
        if self.loop.is_closed():
            return
        connections = ServiceConnection._by_loop.get(self.loop, {})
        for connection in connections.values():
            self.loop.run_until_complete(connection.client.close())
        connections.clear()
        self.loop.close()


class PushWeights(TrainerCallback):
    """Loads the policy into the service's backends before the first generation and after each optimizer step."""

    def __init__(self, bridge: RolloutsTRL) -> None:
        self.bridge = bridge

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.bridge.push(model, state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.bridge.push(model, state.global_step)


def task_of_prompt(prompt: Any, row: str) -> dict[str, Any]:
    """The service task a TRL prompt carries: the prompt itself (a dict or its JSON text), or the
    `rollouts_task` field of one of a chat prompt's messages."""
    if isinstance(prompt, (list, tuple)):
        for message in prompt:
            if isinstance(message, Mapping) and message.get(TASK_FIELD) is not None:
                return task_from(message[TASK_FIELD], row, f"prompt[].{TASK_FIELD}")
        raise RowError(row, f"prompt[].{TASK_FIELD}", "missing: no message carries the service task")
    if isinstance(prompt, Mapping) and TASK_FIELD in prompt:
        return task_from(prompt[TASK_FIELD], row, f"prompt.{TASK_FIELD}")
    if isinstance(prompt, str) and not prompt.lstrip().startswith("{"):
        raise RowError(row, "prompt", "the service task as JSON text (a dict with its kind), not plain text")
    return task_from(prompt, row, "prompt")


def task_prompt(task: Mapping[str, Any]) -> str:
    """The `prompt` value of a TRL row that runs `task` on the service."""
    return json.dumps(dict(task), sort_keys=True)


def _trl_sampling(args: Any) -> dict[str, Any]:
    """GRPOConfig's sampling settings under the names rows.sampling_from reads."""
    if args is None:
        return {}
    names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    params = {name: getattr(args, name, None) for name in names}
    params["max_tokens"] = getattr(args, "max_completion_length", None)
    return params
