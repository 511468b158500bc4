"""SkyRL's generator backed by the service: a whole GeneratorInput as one submission (skyrl==0.3.0).

Use it where SkyRL takes a generator (`GeneratorInterface`): the trainer calls `generate(input)`
once per step; every trajectory of the input becomes one job, all sent in one request. Jobs of
one `instance_id` share a group (`group_id`), `repetition_id` is their `sample_index`, and
`batch_metadata.global_step` is stamped on each job (`metadata.global_step`, and as the trainer's
policy version `metadata.policy_version`, `step-<n>`; the turns' `policy_version` is what sampled
them). With `engines: trainer` the generator first registers SkyRL's own servers (the inference
client's `server_urls`) and declares the step as their weight version, so every turn records it
(rollouts_client/trainers/engines.py). Results are taken as they end and returned in input order.

The row mapping is the verl loop's: `env_extras[i]["rollouts_task"]` is the service task (its
kind renders the prompt; SkyRL's `prompts` are not sent). SkyRL 0.3.0 needs Python 3.12 to import
(its `skyrl.tinker.types` puts a `typing.TypedDict` under pydantic).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput, TrajectoryID

from rollouts_client.models import Job
from rollouts_client.trainers.engines import engines_for, step_version
from rollouts_client.trainers.records import Split, job_seconds, split_record
from rollouts_client.trainers.rows import (
    TASK_FIELD,
    RowError,
    group_id,
    idempotency_key,
    sampling_from,
    task_from,
)
from rollouts_client.trainers.settings import BridgeSettings
from rollouts_client.trainers.waiting import ServiceConnection


class RolloutsGenerator(GeneratorInterface):
    """Generates a SkyRL batch through the service; `settings` as BridgeSettings' names."""

    def __init__(self, inference_engine_client: Any = None, **settings: Any) -> None:
        """`inference_engine_client`: SkyRL's (a RemoteInferenceClient), whose `server_urls` are the servers
        registered with `engines: trainer` when `engine_urls` is not set, and whose `model_name` is then the
        `model` when none is given; unused otherwise."""
        engines = settings.get("engines") or os.environ.get("ROLLOUTS_TRAINER_ENGINES", "service")
        if engines == "trainer" and not settings.get("model") and inference_engine_client is not None:
            settings["model"] = getattr(inference_engine_client, "model_name", None)
        self.settings = BridgeSettings.from_mapping(settings)
        self.server_urls = list(getattr(inference_engine_client, "server_urls", None) or []) or None
        self.engines = None

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        started, started_at = time.perf_counter(), time.time()
        bodies, keys = self.job_bodies(input_batch)
        if self.settings.engines == "trainer":
            await self._declare_step(input_batch)
        connection = ServiceConnection.shared(self.settings)
        results = await connection.run_jobs(bodies, keys, [self._row_name(i) for i in range(len(bodies))])
        splits = [split_record(job, self.settings.on_segments) for job, _ in results]
        per_token = any(s.token_rewards is not None for s in splits)
        rewards = [self._reward(split, job, per_token) for split, (job, _) in zip(splits, results)]
        longest_job = max(job_seconds(job, started_at) for job, _ in results)
        return GeneratorOutput(
            prompt_token_ids=[s.prompt_ids for s in splits],
            response_ids=[s.response_ids for s in splits],
            rewards=rewards,
            loss_masks=[s.response_mask for s in splits],
            stop_reasons=[s.stop_reason for s in splits],
            rollout_metrics={  # scalars: SkyRL's trainer logs them with its tracker
                "rollouts/retried_jobs": sum(attempts > 1 for _, attempts in results),
                "rollouts/bridge_s": time.perf_counter() - started - longest_job,
            },
            rollout_logprobs=[s.response_logprobs for s in splits],
            trajectory_ids=self._trajectory_ids(input_batch),
            trajectory_generation_times=[job_seconds(job) for job, _ in results],
            rollout_expert_indices=None,
            is_last_step=None,
            env_metrics=[
                {"job_id": job.id, "weight_versions": s.weight_versions} for s, (job, _) in zip(splits, results)
            ],
            pixel_values=None,
            image_grid_thw=None,
        )

    async def _declare_step(self, input_batch: GeneratorInput) -> None:
        """The trainer's servers are in the pool and labelled with this step's weights before any job runs."""
        if self.engines is None:
            self.engines = await asyncio.to_thread(engines_for, self.settings, "skyrl", self.server_urls)
        metadata = input_batch.get("batch_metadata")
        await asyncio.to_thread(self.engines.declare, metadata.global_step if metadata is not None else None)

    def close(self) -> None:
        """Deregister the trainer's servers now (`engines: trainer`; else nothing): also done at exit."""
        if self.engines is not None:
            self.engines.close()

    def job_bodies(self, input_batch: GeneratorInput) -> tuple[list[dict[str, Any]], list[str]]:
        """One job per trajectory; RowError naming the row and the field before any is submitted."""
        extras = input_batch.get("env_extras") or [None] * len(input_batch["prompts"])
        metadata = input_batch.get("batch_metadata")
        step = metadata.global_step if metadata is not None else None
        phase = metadata.training_phase if metadata is not None else "train"
        sampling = sampling_from(input_batch.get("sampling_params") or {}, self.settings.max_tokens_per_turn)
        ids = self._trajectory_ids(input_batch)
        bodies, keys = [], []
        for i, extra in enumerate(extras):
            row = self._row_name(i)
            if not isinstance(extra, dict) or TASK_FIELD not in extra:
                raise RowError(row, f"env_extras[{i}].{TASK_FIELD}", "missing: the service task this row runs")
            task = task_from(extra[TASK_FIELD], row, f"env_extras[{i}].{TASK_FIELD}")
            trajectory = ids[i]
            body: dict[str, Any] = {
                "task": task,
                "sampling": sampling,
                "group_id": group_id(self.settings.run_id, phase, step, trajectory.instance_id),
                "sample_index": int(trajectory.repetition_id),
                "metadata": {
                    "trainer": "skyrl",
                    "global_step": step,
                    "training_phase": phase,
                    "instance_id": trajectory.instance_id,
                    "repetition_id": trajectory.repetition_id,
                    "run_id": self.settings.run_id,
                    "policy_version": None if step is None else step_version(step),
                },
            }
            if self.settings.model:
                body["model"] = self.settings.model
            bodies.append(body)
            keys.append(
                idempotency_key(self.settings.run_id, phase, step, trajectory.instance_id, trajectory.repetition_id)
            )
        return bodies, keys

    @staticmethod
    def _trajectory_ids(input_batch: GeneratorInput) -> list[TrajectoryID]:
        """The input's trajectory ids; without them every row is its own instance (GRPO groups of one)."""
        given = input_batch.get("trajectory_ids")
        if given is not None:
            if len(given) != len(input_batch["prompts"]):
                raise RowError("*", "trajectory_ids", f"{len(given)} ids for {len(input_batch['prompts'])} prompts")
            return list(given)
        return [TrajectoryID(instance_id=str(i), repetition_id=0) for i in range(len(input_batch["prompts"]))]

    @staticmethod
    def _reward(split: Split, job: Job, per_token: bool) -> float | list[float]:
        """The trajectory's reward, or per-token rewards when any row has them (SkyRL wants one shape per batch):
        a row without its own gets its reward on its last response token. No reward at all is an error, not 0."""
        if per_token and split.token_rewards is not None:
            return split.token_rewards
        if job.reward is None:
            raise ValueError(f"job {job.id}: done without a reward (its kind's evaluation gave none)")
        if not per_token:
            return float(job.reward)
        row = [0.0] * len(split.response_ids)
        row[-1] = float(job.reward)
        return row

    @staticmethod
    def _row_name(index: int) -> str:
        return str(index)
