"""SkyRL's generator backed by the service: a whole GeneratorInput as one submission (skyrl 0.3.0; 0.4.0 read).

Use it where SkyRL takes a generator (`GeneratorInterface`): the trainer calls `generate(input)`
once per step; every trajectory of the input becomes one job, all sent in one request. Jobs of
one `instance_id` share a group (`group_id`), `repetition_id` is their `sample_index`, and
`batch_metadata.global_step` is stamped on each job (`metadata.global_step`, and as the trainer's
policy version `metadata.policy_version`, `step-<n>`; the turns' `policy_version` is what sampled
them). With `engines: trainer` the generator first registers SkyRL's own servers (the inference
client's `server_urls`) and declares the step as their weight version, so every turn records it
(rollouts_client/trainers/engines.py). Results are taken as they end and returned in input order.

The row mapping is the verl loop's: `env_extras[i]["rollouts_task"]` is the service task (its
kind renders the prompt; SkyRL's `prompts` are not sent).

Step-wise output (`generator.step_wise_trajectories`, read from the `generator_cfg` SkyRL hands its own
generators, or `step_wise=`): one row per assistant turn, as SkyRL's SkyRLGymGenerator makes them (prompt =
every token before the turn, response = the turn's tokens and the observation after it, masked 0; per-token
rewards, the job's reward on the last step's last generated token; `trajectory_ids` repeated per step,
`is_last_step` True on each trajectory's last row). Otherwise one row per trajectory and `is_last_step` None,
as SkyRL's own generator sets it. SkyRL 0.3.0 needs Python 3.12 to import
(its `skyrl.tinker.types` puts a `typing.TypedDict` under pydantic).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
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

# SkyRL 0.4.0 added `trajectory_time_splits` ({"llm": [...], "env": [...]}); 0.3.0 has no such field, and its
# step-wise merge slices every non-None value by row, so the key is only set where GeneratorOutput declares it.
TIME_SPLITS = "trajectory_time_splits" in GeneratorOutput.__annotations__


@dataclass(frozen=True)
class Row:
    """One GeneratorOutput row: a whole trajectory, or one assistant turn of it (step-wise)."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float | list[float]
    stop_reason: str
    trajectory_id: TrajectoryID
    is_last_step: bool
    seconds: float  # the job's, on each of its rows (SkyRL's own repeats the trajectory's time per step)
    env_metrics: dict[str, Any]
    time_split: dict[str, float] | None  # the job's `llm` and `env` seconds, on each of its rows


class RolloutsGenerator(GeneratorInterface):
    """Generates a SkyRL batch through the service; `settings` as BridgeSettings' names."""

    def __init__(
        self,
        inference_engine_client: Any = None,
        generator_cfg: Any = None,
        step_wise: bool | None = None,
        **settings: Any,
    ) -> None:
        """`inference_engine_client`: SkyRL's (a RemoteInferenceClient), whose `server_urls` are the servers
        registered with `engines: trainer` when `engine_urls` is not set, and whose `model_name` is then the
        `model` when none is given; unused otherwise. `generator_cfg`: SkyRL's `cfg.generator`, read for
        `step_wise_trajectories` (the trainer validates and consumes the output by the same switch);
        `step_wise`, when given, overrides it."""
        engines = settings.get("engines") or os.environ.get("ROLLOUTS_TRAINER_ENGINES", "service")
        if engines == "trainer" and not settings.get("model") and inference_engine_client is not None:
            settings["model"] = getattr(inference_engine_client, "model_name", None)
        self.settings = BridgeSettings.from_mapping(settings)
        self.server_urls = list(getattr(inference_engine_client, "server_urls", None) or []) or None
        self.engines = None
        if step_wise is None:
            step_wise = bool(getattr(generator_cfg, "step_wise_trajectories", False))
        self.step_wise = step_wise

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        started, started_at = time.perf_counter(), time.time()
        bodies, keys = self.job_bodies(input_batch)
        if self.settings.engines == "trainer":
            await self._declare_step(input_batch)
        connection = ServiceConnection.shared(self.settings)
        results = await connection.run_jobs(bodies, keys, [self._row_name(i) for i in range(len(bodies))])
        jobs = [job for job, _ in results]
        splits = [split_record(job, self.settings.on_segments) for job in jobs]
        ids = self._trajectory_ids(input_batch)
        if self.step_wise:
            rows = [row for job, s, t in zip(jobs, splits, ids) for row in step_rows(job, s, t)]
        else:
            per_token = any(s.token_rewards is not None for s in splits)
            rows = [trajectory_row(job, s, t, self._reward(s, job, per_token)) for job, s, t in zip(jobs, splits, ids)]
        longest_job = max(job_seconds(job, started_at) for job in jobs)
        metrics = {  # scalars: SkyRL's trainer logs them with its tracker
            "rollouts/retried_jobs": sum(attempts > 1 for _, attempts in results),
            "rollouts/bridge_s": time.perf_counter() - started - longest_job,
        }
        return self._output(rows, metrics)

    def _output(self, rows: list[Row], metrics: dict[str, float]) -> GeneratorOutput:
        """The rows as SkyRL's columns; `is_last_step` only step-wise (None otherwise, as SkyRL's own sets it)."""
        output = GeneratorOutput(
            prompt_token_ids=[r.prompt_ids for r in rows],
            response_ids=[r.response_ids for r in rows],
            rewards=[r.reward for r in rows],
            loss_masks=[r.loss_mask for r in rows],
            stop_reasons=[r.stop_reason for r in rows],
            rollout_metrics=metrics,
            rollout_logprobs=[r.logprobs for r in rows],
            trajectory_ids=[r.trajectory_id for r in rows],
            trajectory_generation_times=[r.seconds for r in rows],
            rollout_expert_indices=None,
            is_last_step=[r.is_last_step for r in rows] if self.step_wise else None,
            env_metrics=[r.env_metrics for r in rows],
            pixel_values=None,
            image_grid_thw=None,
        )
        if TIME_SPLITS:
            output["trajectory_time_splits"] = time_splits(rows)  # type: ignore[typeddict-unknown-key]
        return output

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


def trajectory_row(job: Job, split: Split, trajectory: TrajectoryID, reward: float | list[float]) -> Row:
    """The whole record as one row (SkyRL's non-step-wise shape)."""
    return Row(
        prompt_ids=split.prompt_ids,
        response_ids=split.response_ids,
        loss_mask=split.response_mask,
        logprobs=split.response_logprobs,
        reward=reward,
        stop_reason=split.stop_reason,
        trajectory_id=trajectory,
        is_last_step=True,
        seconds=job_seconds(job),
        env_metrics={"job_id": job.id, "weight_versions": split.weight_versions},
        time_split=record_time_split(split),
    )


def step_rows(job: Job, split: Split, trajectory: TrajectoryID) -> list[Row]:
    """One row per assistant turn, as SkyRL's step-wise agent loop makes them: the prompt is every token before
    the turn, the response the turn and the observation after it (mask 0, logprobs 0.0), so one step's prompt
    and response are the next step's prompt and the last step's are the whole record. Rewards are per token:
    the record's `token_rewards` over each step, else the job's reward on the last step's last generated token
    (SkyRL's advantages read the last step only, and broadcast them to the trajectory's steps)."""
    tokens = split.prompt_ids + split.response_ids
    spans = assistant_spans(job, len(split.prompt_ids), len(tokens))
    if split.token_rewards is None and job.reward is None:
        raise ValueError(f"job {job.id}: done without a reward (its kind's evaluation gave none)")
    rows = []
    for j, (start, generated_end, end) in enumerate(spans):
        last = j == len(spans) - 1
        rows.append(
            Row(
                prompt_ids=tokens[:start],
                response_ids=tokens[start:end],
                loss_mask=_cut(split.response_mask, split, start, end),
                logprobs=_cut(split.response_logprobs, split, start, end),
                reward=_step_reward(job, split, start, generated_end, end, last),
                stop_reason=split.stop_reason if last else _finish_reason(job, j, split.stop_reason),
                trajectory_id=trajectory,
                is_last_step=last,
                seconds=job_seconds(job),
                env_metrics={"job_id": job.id, "step": j, "weight_versions": split.weight_versions[j : j + 1]},
                time_split=record_time_split(split),
            )
        )
    return rows


def assistant_spans(job: Job, prompt_length: int, length: int) -> list[tuple[int, int, int]]:
    """Per assistant turn of the trained record (the last segment): its start, the end of its generated tokens,
    and the start of the next assistant turn (or the record's end). A record with no assistant turn is one
    step: its whole response."""
    turns = [t for t in (job.trajectory or {}).get("turns") or [] if t.get("role") == "assistant"]
    starts = [int(t["start"]) for t in turns if int(t["start"]) >= prompt_length]
    if not starts:
        return [(prompt_length, length, length)]
    ends = [int(t["end"]) for t in turns if int(t["start"]) >= prompt_length]
    return [(s, e, nxt) for s, e, nxt in zip(starts, ends, [*starts[1:], length])]


def _cut(values: list[Any], split: Split, start: int, end: int) -> list[Any]:
    """A response-aligned list's slice for the record's token range [start, end)."""
    p = len(split.prompt_ids)
    return list(values[start - p : end - p])


def _step_reward(job: Job, split: Split, start: int, generated_end: int, end: int, last: bool) -> list[float]:
    if split.token_rewards is not None:
        return _cut(split.token_rewards, split, start, end)
    rewards = [0.0] * (end - start)
    if last and rewards:
        rewards[max(generated_end - start, 1) - 1] = float(job.reward)  # type: ignore[arg-type]
    return rewards


def _finish_reason(job: Job, step: int, default: str) -> str:
    """The j-th assistant turn's own finish reason (vLLM's `stop`/`length`, as SkyRL's per-step stop reasons)."""
    turns = [t for t in (job.trajectory or {}).get("turns") or [] if t.get("role") == "assistant"]
    reason = turns[step].get("finish_reason") if step < len(turns) else None
    return str(reason or default)


def record_time_split(split: Split) -> dict[str, float] | None:
    """SkyRL 0.4.0's split of a trajectory's time: `llm` (the record's `llm_s`) and `env` (`tools_s`); None when
    the record lacks either (an external agent's records have no tool time)."""
    if "llm_s" not in split.timings or "tools_s" not in split.timings:
        return None
    return {"llm": split.timings["llm_s"], "env": split.timings["tools_s"]}


def time_splits(rows: list[Row]) -> dict[str, list[float]] | None:
    """`trajectory_time_splits`: one entry per row, None if any row has none (as SkyRL 0.4.0 builds it)."""
    if not rows or any(r.time_split is None for r in rows):
        return None
    return {name: [r.time_split[name] for r in rows] for name in ("llm", "env")}  # type: ignore[index]
