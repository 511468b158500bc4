"""verl's agent loop backed by the service: one dataset row -> one job -> one AgentLoopOutput (verl==0.9.1).

Register it through verl's agent-loop YAML (`actor_rollout_ref.rollout.agent.agent_loop_config_path`,
examples/verl/agent_loops.yaml), whose entry's keys are its settings (BridgeSettings' names), or with
`register_agent_loop()`; select it with the rows' `agent_name` (or `rollout.agent.default_agent_loop`).
The service is ROLLOUTS_API_URL / ROLLOUTS_API_TOKEN unless the settings name it. Importing this module
registers nothing: verl imports it when it first builds a loop, after reading the YAML, and a
registration then would replace the YAML's entry and drop its settings.

verl's contract (0.9.1): `AgentLoopWorker._run_agent_loop` awaits exactly one AgentLoopOutput per
row and pads it as one (prompt, response) pair, so a record with earlier segments is trained on
its last segment (`on_segments: last`, the count in extra_fields) or refused (`raise`), never
concatenated.

The trainer's own servers (`engines: trainer`): verl 0.9.1 runs its vLLM servers itself and loads each
step's weights into them in place. The loop registers them in the pool (`engine_urls`, else the
addresses verl's load balancer routes to: `server_manager._load_balancer.get_all_servers()`, the
`LLMServerManager: [...]` line verl prints at start) and declares the step as their weight version.
verl 0.9.1 does not pass the step to `run()`: `batch.meta_info["global_steps"]` reaches
`AgentLoopWorker.generate_sequences` and, from there, only verl's rollout-trace attributes around
`run()` (set when `actor_rollout_ref.rollout.trace.backend` is configured). With a trace backend the
loop reads it there; without one it declares nothing, and the driver declares the step instead
(`TrainerEngines.declare(self.global_steps)` once per step: docs/TRAINERS.md).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from typing import Any, ClassVar

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.utils import rollout_trace

from rollouts_client.trainers.engines import engines_for, step_version
from rollouts_client.trainers.records import job_seconds, split_record
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

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        started, started_at = time.perf_counter(), time.time()
        row = self._row_name(kwargs)
        body = self.job_body(sampling_params, kwargs, row)
        if self.settings.engines == "trainer":
            step = await self._declare_step()
            body["metadata"]["policy_version"] = None if step is None else step_version(step)
        connection = ServiceConnection.shared(self.settings)
        job, attempts = await connection.run_job(body, self._key(kwargs), row)
        split = split_record(job, self.settings.on_segments)
        response_length = int(self.rollout_config.response_length)
        if len(split.prompt_ids) > int(self.rollout_config.prompt_length):
            raise ValueError(
                f"row {row}: job {job.id}'s prompt has {len(split.prompt_ids)} tokens, more than "
                f"rollout.prompt_length={self.rollout_config.prompt_length}: raise it (a cut prompt is not what was sampled)"
            )
        truncated = len(split.response_ids) > response_length  # as verl's own ToolAgentLoop cuts at response_length
        evaluation = (job.result or {}).get("evaluation") or {}
        return AgentLoopOutput(
            prompt_ids=split.prompt_ids,
            response_ids=split.response_ids[:response_length],
            response_mask=split.response_mask[:response_length],
            response_logprobs=split.response_logprobs[:response_length],
            reward_score=None if job.reward is None else float(job.reward),
            num_turns=split.num_turns,
            metrics=AgentLoopMetrics(
                generate_sequences=split.timings.get("llm_s", 0.0), tool_calls=split.timings.get("tools_s", 0.0)
            ),
            extra_fields={
                "rollouts_job_id": job.id,
                "rollouts_attempts": attempts,
                "rollouts_evaluation": evaluation,
                "rollouts_weight_versions": split.weight_versions,
                "rollouts_stop_reason": split.stop_reason,
                "rollouts_earlier_segments": split.earlier_segments,
                "rollouts_conversation": split.conversation,
                "rollouts_response_truncated": truncated,
                "rollouts_bridge_s": time.perf_counter() - started - job_seconds(job, started_at),
            },
        )

    async def _declare_step(self) -> int | None:
        """Register verl's own servers (`engine_urls`, else the addresses verl's load balancer routes to) and
        declare the step when verl says it; the step, None when verl does not say (see the module's doc)."""
        discovered = None
        if not self.settings.engine_urls:
            balancer = getattr(self.server_manager, "_load_balancer", None)  # verl 0.9.1's LLMServerClient
            if balancer is not None:
                discovered = list(await balancer.get_all_servers.remote())
        engines = await asyncio.to_thread(engines_for, self.settings, "verl", discovered)
        step = verl_step()
        await asyncio.to_thread(engines.declare, step)
        return step

    def job_body(self, sampling_params: dict[str, Any], row_fields: dict[str, Any], row: str) -> dict[str, Any]:
        """The job for one row; RowError (naming the row and the field) before anything is sent."""
        extra_info = plain(row_fields.get("extra_info")) or {}
        if TASK_FIELD in row_fields:
            task = task_from(row_fields[TASK_FIELD], row, TASK_FIELD)
        elif isinstance(extra_info, dict) and TASK_FIELD in extra_info:
            task = task_from(extra_info[TASK_FIELD], row, f"extra_info.{TASK_FIELD}")
        else:
            raise RowError(row, f"extra_info.{TASK_FIELD}", "missing: the service task this row runs")
        rollout = self.rollout_config
        limits: dict[str, Any] = {"max_tokens": int(rollout.prompt_length) + int(rollout.response_length)}
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

    def _key(self, row_fields: dict[str, Any]) -> str:
        """The job's idempotency key: run id, row identity and which sample of that row this is.

        The identity is the row's `rollouts_key` (in extra_info) when it has one, else verl's `uid`
        of the prompt; a row with neither gets a fresh key (safe, but not found again after a restart).
        """
        extra_info = plain(row_fields.get("extra_info")) or {}
        identity = (extra_info.get(KEY_FIELD) if isinstance(extra_info, dict) else None) or plain(row_fields.get("uid"))
        if identity is None:
            return idempotency_key(self.settings.run_id, uuid.uuid4().hex)
        seen = (self.settings.run_id, str(identity))
        occurrence = RolloutsAgentLoop._seen[seen]
        RolloutsAgentLoop._seen[seen] += 1
        return idempotency_key(self.settings.run_id, identity, occurrence)

    @staticmethod
    def _row_name(row_fields: dict[str, Any]) -> str:
        index = plain(row_fields.get("index"))
        source = plain(row_fields.get("data_source"))
        return f"{index}" + (f" ({source})" if source else "")


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
