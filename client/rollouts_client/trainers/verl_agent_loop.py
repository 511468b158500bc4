"""verl's agent loop backed by the service: one sample -> one job -> its AgentLoopOutput(s) (verl 0.9.1, V1 and legacy).

Register it through verl's agent-loop YAML (`actor_rollout_ref.rollout.agent.agent_loop_config_path`,
examples/verl/agent_loops.yaml), whose entry's keys are its settings (BridgeSettings' names), or with
`register_agent_loop()`; select it with the rows' `agent_name` (or `rollout.agent.default_agent_loop`).
The service is ROLLOUTS_API_URL / ROLLOUTS_API_TOKEN unless the settings name it. Importing this module
registers nothing: verl imports it when it first builds a loop, after reading the YAML, and a
registration then would replace the YAML's entry and drop its settings.

verl 0.9.1 has two workers that call `run()`:
- V1 (`trainer.use_v1: true`, the default: main_ppo's TaskRunnerV1): `AgentLoopWorkerTQ` (verl/trainer/ppo/v1/
  agent_loop_tq.py) calls `run()` once per (prompt `uid`, `session_id` in 0..n-1) with the prompt's
  `global_steps` among the kwargs, and takes one AgentLoopOutput or a list of them (stored as
  `{uid}_{session_id}_{i}`, the last one's reward copied to the others). The job is keyed by (run, row identity,
  session_id), so a prompt verl re-issues after a resume (same uid, same session_id, a later step) finds its
  running or finished job. Every earlier segment of a record is an output of its own (`on_segments: all`,
  V1's default), each tagged with `min_global_steps` / `max_global_steps` (the policy versions that sampled it:
  V1's trainer turns them into an int array for its staleness metrics).
- Legacy (`trainer.use_v1: false`): `AgentLoopWorker._run_agent_loop` passes the row's fields only and awaits
  exactly one AgentLoopOutput, padded as one (prompt, response) pair, so a record with earlier segments is
  trained on its last segment (`on_segments: last`, the count in extra_fields) or refused (`raise`), never
  concatenated; the n samples of a row are told apart by their order in this process.

The trainer's own servers (`engines: trainer`): verl 0.9.1 runs its vLLM servers itself and loads each
step's weights into them in place. The loop registers them in the pool (`engine_urls`, else the
addresses verl's load balancer routes to: `server_manager._load_balancer.get_all_servers()`, the
`LLMServerManager: [...]` line verl prints at start) and declares a step as their weight version. Under V1 it
is verl's own version of the weights sampling the prompt's step (`global_steps - 1`: verl loads step k's
weights with `set_global_steps(k)` after step k, and `step-0` at start), so the record's `step-<n>` labels and
verl's min/max_global_steps are the same numbers. The legacy worker passes no step: it is read from verl's
rollout-trace attributes around `run()` (set when `actor_rollout_ref.rollout.trace.backend` is configured);
without a trace backend the loop declares nothing, and the driver declares the step instead
(`TrainerEngines.declare(self.global_steps)` once per step: docs/TRAINERS.md).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.utils import rollout_trace

from rollouts_client.models import Job
from rollouts_client.trainers.engines import engines_for, step_version
from rollouts_client.trainers.records import Split, job_seconds, split_segments, step_range
from rollouts_client.trainers.rows import (
    KEY_FIELD,
    TASK_FIELD,
    RowError,
    idempotency_key,
    plain,
    sampling_from,
    task_from,
)
from rollouts_client.trainers.settings import BridgeSettings
from rollouts_client.trainers.waiting import ServiceConnection

AGENT_NAME = "rollouts"


@dataclass(frozen=True)
class Sample:
    """What verl's worker says of the sample beyond the row's fields: V1's AgentLoopWorkerTQ passes all three,
    the legacy AgentLoopWorker none."""

    global_steps: int | None = None  # the trainer's step when the prompt was (re-)issued
    uid: str | None = None  # the prompt's id, kept when V1 re-issues it
    session_id: int | None = None  # which of its n samples: 0..n-1

    @classmethod
    def of(cls, row_fields: dict[str, Any]) -> Sample:
        steps, uid, session = (plain(row_fields.get(k)) for k in ("global_steps", "uid", "session_id"))
        return cls(
            None if steps is None else int(steps),
            None if uid is None else str(uid),
            None if session is None else int(session),
        )

    @property
    def v1(self) -> bool:
        """Called by V1's AgentLoopWorkerTQ (the only worker that passes a session id): it takes a list of outputs."""
        return self.session_id is not None

    @property
    def policy_version(self) -> int | None:
        """verl's version of the weights its servers hold while this prompt's step samples: V1 loads step k's
        weights as version k after step k (`checkpoint_manager.update_weights(global_steps)`, `step-0` at
        start), and its trainer counts a trajectory of step s with max_global_steps s - 1 as on-policy."""
        return None if self.global_steps is None else max(self.global_steps - 1, 0)


class RolloutsAgentLoop(AgentLoopBase):
    """Runs the row's task as a service job and returns its token-exact record."""

    # Occurrences of a row identity in this process: the n samples of one prompt get distinct keys.
    _seen: ClassVar[Counter[tuple[str, str]]] = Counter()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = set(BridgeSettings.__dataclass_fields__) - {"retry"}
        own = {name: plain(kwargs.pop(name)) for name in list(kwargs) if name in names}
        kwargs.pop("tools", None)  # verl hands every loop its tool list; the service's kind has its own tools
        super().__init__(*args, **kwargs)
        self.settings = BridgeSettings.from_mapping(own)
        self._segments_given = "on_segments" in own  # unset: the worker's default (V1 all, legacy last)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        started, started_at = time.perf_counter(), time.time()
        sample = Sample.of(kwargs)
        on_segments = self.segments_for(sample)
        row = self.row_name(kwargs)
        body = self.job_body(sampling_params, kwargs, row)
        if self.settings.engines == "trainer":
            step = await self.declare_step(sample)
            if not sample.v1:  # under V1 a re-issued prompt must send the same body: its step is a later one
                body["metadata"]["policy_version"] = None if step is None else step_version(step)
        connection = ServiceConnection.shared(self.settings)
        job, attempts = await connection.run_job(body, self.job_key(kwargs, sample), row)
        outputs = self.outputs(job, attempts, sample, row, on_segments)
        bridge_s = time.perf_counter() - started - job_seconds(job, started_at)
        for output in outputs:
            output.extra_fields["rollouts_bridge_s"] = bridge_s
        return outputs if sample.v1 else outputs[-1]

    def segments_for(self, sample: Sample) -> str:
        """The setting, or the worker's default when unset: V1 takes every segment, the legacy worker one."""
        if not self._segments_given:
            return "all" if sample.v1 else self.settings.on_segments
        if self.settings.on_segments == "all" and not sample.v1:
            raise ValueError(
                "on_segments: all needs verl's V1 worker (AgentLoopWorkerTQ, trainer.use_v1: true); the legacy "
                "AgentLoopWorker takes one output per row: use last or raise"
            )
        return self.settings.on_segments

    def outputs(self, job: Job, attempts: int, sample: Sample, row: str, on_segments: str) -> list[AgentLoopOutput]:
        """The done job's trained segments as verl's outputs, oldest first (the evaluated one last)."""
        return [self._output(job, attempts, split, sample, row) for split in split_segments(job, on_segments)]

    def _output(self, job: Job, attempts: int, split: Split, sample: Sample, row: str) -> AgentLoopOutput:
        """One trained segment as verl's output; a response longer than response_length is cut, a prompt longer
        than prompt_length refused (a cut prompt is not what was sampled)."""
        response_length = int(self.rollout_config.response_length)
        if len(split.prompt_ids) > int(self.rollout_config.prompt_length):
            raise ValueError(
                f"row {row}: job {job.id}'s prompt has {len(split.prompt_ids)} tokens, more than "
                f"rollout.prompt_length={self.rollout_config.prompt_length}: raise it (a cut prompt is not what was sampled)"
            )
        reward = None if job.reward is None else float(job.reward)
        return AgentLoopOutput(
            prompt_ids=split.prompt_ids,
            response_ids=split.response_ids[:response_length],
            response_mask=split.response_mask[:response_length],
            response_logprobs=split.response_logprobs[:response_length],
            reward_score=reward,
            num_turns=split.num_turns,
            metrics=AgentLoopMetrics(
                generate_sequences=split.timings.get("llm_s", 0.0), tool_calls=split.timings.get("tools_s", 0.0)
            ),
            extra_fields={
                **self._extra_fields(job, attempts, split, response_length),
                **v1_fields(split, sample, reward),
            },
        )

    @staticmethod
    def _extra_fields(job: Job, attempts: int, split: Split, response_length: int) -> dict[str, Any]:
        return {
            "rollouts_job_id": job.id,
            "rollouts_attempts": attempts,
            "rollouts_evaluation": (job.result or {}).get("evaluation") or {},
            "rollouts_weight_versions": split.weight_versions,
            "rollouts_stop_reason": split.stop_reason,
            "rollouts_earlier_segments": split.earlier_segments,
            "rollouts_conversation": split.conversation,
            # as verl's own ToolAgentLoop cuts at response_length
            "rollouts_response_truncated": len(split.response_ids) > response_length,
        }

    async def declare_step(self, sample: Sample) -> int | None:
        """Register verl's own servers (`engine_urls`, else the addresses verl's load balancer routes to) and
        declare the step when verl says it (V1: its weights' version for the prompt's step; legacy: the trace's
        step); the step, None when verl does not say (see the module's doc)."""
        discovered = None
        if not self.settings.engine_urls:
            balancer = getattr(self.server_manager, "_load_balancer", None)  # verl 0.9.1's LLMServerClient
            if balancer is not None:
                discovered = list(await balancer.get_all_servers.remote())
        engines = await asyncio.to_thread(engines_for, self.settings, "verl", discovered)
        step = sample.policy_version if sample.v1 else verl_step()
        await asyncio.to_thread(engines.declare, step)
        return step

    def job_body(self, sampling_params: dict[str, Any], row_fields: dict[str, Any], row: str) -> dict[str, Any]:
        """The job for one row; RowError (naming the row and the field) before anything is sent.

        `limits.max_prompt_tokens` is rollout.prompt_length: verl pads every prompt to it, so a longer one fails
        the job when the service renders it, before any generation (JobFailed, prompt_too_long, not retried),
        instead of after the whole rollout in `_output`."""
        extra_info = plain(row_fields.get("extra_info")) or {}
        if TASK_FIELD in row_fields:
            task = task_from(row_fields[TASK_FIELD], row, TASK_FIELD)
        elif isinstance(extra_info, dict) and TASK_FIELD in extra_info:
            task = task_from(extra_info[TASK_FIELD], row, f"extra_info.{TASK_FIELD}")
        else:
            raise RowError(row, f"extra_info.{TASK_FIELD}", "missing: the service task this row runs")
        rollout = self.rollout_config
        limits: dict[str, Any] = {
            "max_tokens": int(rollout.prompt_length) + int(rollout.response_length),
            "max_prompt_tokens": int(rollout.prompt_length),
        }
        max_turns = rollout.multi_turn.get("max_assistant_turns") if rollout.get("multi_turn") else None
        if max_turns:
            limits["max_turns"] = int(max_turns)
        body: dict[str, Any] = {
            "task": task,
            "sampling": sampling_from(
                sampling_params, self.settings.max_tokens_per_turn or int(rollout.response_length)
            ),
            "limits": limits,
            "metadata": {"trainer": "verl", "row": row, "run_id": self.settings.run_id},
        }
        if self.settings.model:
            body["model"] = self.settings.model
        return body

    def job_key(self, row_fields: dict[str, Any], sample: Sample) -> str:
        """The job's idempotency key: run id, row identity and which sample of that row this is.

        The identity is the row's `rollouts_key` (in extra_info) when it has one, else verl's `uid` of the
        prompt; a row with neither gets a fresh key (safe, but not found again after a restart). The sample is
        V1's `session_id` (a prompt V1 re-issues keeps its uid and session ids, so it finds its job), else its
        occurrence in this process (legacy: the n samples of a prompt arrive one after another).
        """
        extra_info = plain(row_fields.get("extra_info")) or {}
        identity = (extra_info.get(KEY_FIELD) if isinstance(extra_info, dict) else None) or sample.uid
        if identity is None:
            return idempotency_key(self.settings.run_id, uuid.uuid4().hex)
        if sample.session_id is not None:
            return idempotency_key(self.settings.run_id, identity, sample.session_id)
        seen = (self.settings.run_id, str(identity))
        occurrence = RolloutsAgentLoop._seen[seen]
        RolloutsAgentLoop._seen[seen] += 1
        return idempotency_key(self.settings.run_id, identity, occurrence)

    @staticmethod
    def row_name(row_fields: dict[str, Any]) -> str:
        index = plain(row_fields.get("index"))
        source = plain(row_fields.get("data_source"))
        return f"{index}" + (f" ({source})" if source else "")


def v1_fields(split: Split, sample: Sample, reward: float | None) -> dict[str, Any]:
    """What V1 reads of every output's extra_fields: the policy versions that sampled it (AgentLoopWorkerTQ tags
    each trajectory with them, and V1's trainer makes an int array of them for its staleness metrics), and the
    reward's extra info (copied from the last output to the others when the reward is given). Nothing under the
    legacy worker, which reads neither."""
    if not sample.v1:
        return {}
    steps = step_range(split.weight_versions)  # the record's step versions, where the turns have them
    if steps is None:  # else the weights verl held when the prompt's step sampled it
        version = sample.policy_version if sample.policy_version is not None else 0
        steps = (version, version)
    fields: dict[str, Any] = {"min_global_steps": steps[0], "max_global_steps": steps[1]}
    if reward is not None:
        fields["reward_extra_info"] = {}
    return fields


def verl_step() -> int | None:
    """The training step of the batch this row belongs to, where verl 0.9.1 lets a loop see it: its rollout
    trace attributes (set around `run()` from `batch.meta_info["global_steps"]` when a trace backend is
    configured). None otherwise, and for validation (the step's weights were declared when it trained)."""
    attributes = rollout_trace._trace_attributes.get() or {}
    step = attributes.get("step")
    if step is None or attributes.get("validate") or int(step) < 0:
        return None
    return int(step)


def register_agent_loop(name: str = AGENT_NAME) -> None:
    """Register the loop under `name` with its default settings (the YAML is the way to give it settings)."""
    register(name)(RolloutsAgentLoop)
