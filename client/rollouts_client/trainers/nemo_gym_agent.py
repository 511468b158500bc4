"""A NeMo Gym agent server whose rollouts are the service's jobs (nemo-gym 0.4.0, Python >= 3.12).

NeMo Gym (and NeMo-RL through it) sends each dataset row to an agent server's `POST /run` and trains on the
verify response: the reward and the output items' per-call `prompt_token_ids`, `generation_token_ids` and
`generation_log_probs`. This agent is a `SimpleResponsesAPIAgent` like NeMo Gym's own: `/run` submits the row's
service task (`rollouts_task`, a dict or its JSON text whose `kind` names the task kind; the kind renders the
prompt, so the row's `responses_create_params.input` is not sent) as one job, waits for it with the client's long
poll (one watch for every row this process runs at once: waiting.ServiceConnection), and answers with the record
as NeMo Gym output items (nemo_gym_items.py) and the job's reward.

Failures are HTTP errors, never a reward: a row the job cannot be made from (no task, no kind, a kind or field the
service refuses, a prompt over the job's limits) is a 422 naming the field, which NeMo-RL classes as the row's own
failure; a job that failed, timed out or was cancelled (after `max_attempts` when `on_failure: retry`) is a 502, a
service that cannot be reached (after the client's retries) a 503, a wait past `wait_timeout_s` a 504: NeMo-RL
classes 5xx as infrastructure (nemo_rl/experience/failures.py, `http_status_is_infra`).

Settings: the agent config's `rollouts` mapping, BridgeSettings' names (`api_url`, `token`, `model`, `run_id`,
`on_failure`, `max_attempts`, `on_segments`, `max_tokens_per_turn`, `wait_timeout_s`). `on_segments` is "last" by
default (the evaluated segment): "all" answers every segment's calls in one output, which NeMo-RL's continuity check
refuses when the segments are separate conversations (each call's prompt must extend every token before it).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

import httpx
from fastapi import Body, HTTPException
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.global_config import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from nemo_gym.openai_utils import (
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseUsage,
)
from pydantic import ConfigDict, Field

from rollouts_client.errors import ApiError, WaitTimeout
from rollouts_client.models import Job
from rollouts_client.trainers.nemo_gym_items import job_items
from rollouts_client.trainers.records import JobFailed, SegmentedRecord, input_error
from rollouts_client.trainers.rows import KEY_FIELD, TASK_FIELD, RowError, group_id, idempotency_key, task_from
from rollouts_client.trainers.settings import BridgeSettings
from rollouts_client.trainers.waiting import ServiceConnection

TRAINER = "nemo-gym"


class RolloutsAgentConfig(BaseResponsesAPIAgentConfig):
    """The agent's entry in NeMo Gym's config; `rollouts`: BridgeSettings' names."""

    rollouts: dict[str, Any] = Field(default_factory=dict)


class RolloutsRunRequest(BaseRunRequest):
    """A dataset row: the service task in `rollouts_task`; the rest (agent_ref, NeMo Gym's indices) is echoed.
    `responses_create_params` may be left out (its sampling fields are read when given)."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming = Field(
        default_factory=lambda: NeMoGymResponseCreateParamsNonStreaming(input=[])
    )


class RolloutsVerifyResponse(BaseVerifyResponse):
    """The verify response: the row, the response (the record's items), the job's reward, and `rollouts_*` fields
    (job id, attempts, stop reason, segments answered)."""

    model_config = ConfigDict(extra="allow")


class RolloutsAgent(SimpleResponsesAPIAgent):
    """NeMo Gym's agent server, backed by the service: `/run` is one job per row."""

    config: RolloutsAgentConfig

    def settings(self) -> BridgeSettings:
        return BridgeSettings.from_mapping(dict(self.config.rollouts))

    async def run(self, body: RolloutsRunRequest = Body()) -> RolloutsVerifyResponse:
        row = body.model_dump()
        job, attempts, response = await self.run_row(row, body.responses_create_params)
        echoed = {k: v for k, v in row.items() if k not in ("responses_create_params", "response", "reward")}
        return RolloutsVerifyResponse(
            **echoed,
            responses_create_params=body.responses_create_params,
            response=response,
            reward=float(job.reward),  # run_row refused a job without one
            rollouts_job_id=job.id,
            rollouts_attempts=attempts,
            rollouts_stop_reason=(job.trajectory or {}).get("stop_reason"),
            rollouts_segments=len((job.trajectory or {}).get("segments") or []) + 1,
        )

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        """The response alone, for a caller of the Responses API: the task is `metadata.rollouts_task` (JSON text,
        the API's metadata being strings) and `metadata.rollouts_key` the optional key."""
        metadata = body.metadata or {}
        row = {TASK_FIELD: metadata.get(TASK_FIELD), KEY_FIELD: metadata.get(KEY_FIELD)}
        _, _, response = await self.run_row(row, body, field_prefix="metadata.")
        return response

    async def run_row(
        self, row: dict[str, Any], params: NeMoGymResponseCreateParamsNonStreaming, field_prefix: str = ""
    ) -> tuple[Job, int, NeMoGymResponse]:
        """Submit the row's job, wait for it, and build the response; every failure as its HTTP error."""
        settings = self.settings()
        name = row_name(row)
        try:
            body, key = job_body(row, params, settings, field_prefix)
            job, attempts = await ServiceConnection.shared(settings).run_job(body, key, name)
            if settings.on_segments == "raise" and (job.trajectory or {}).get("segments"):
                raise SegmentedRecord(f"job {job.id}: the record has earlier segments (on_segments: raise)")
            if job.reward is None:
                raise HTTPException(502, {"error": "no_reward", "job_id": job.id, "message": "done without a reward"})
            return job, attempts, response_of(job, params, settings)
        except RowError as exc:
            raise HTTPException(422, {"error": "bad_row", "field": exc.field, "message": str(exc)}) from exc
        except SegmentedRecord as exc:
            raise HTTPException(422, {"error": "segmented_record", "message": str(exc)}) from exc
        except JobFailed as exc:
            status = 422 if input_error(exc.job) else 502  # its input cannot run: the row's failure, not infra
            detail = {"error": f"job_{exc.job.status}", "job_id": exc.job.id, "message": str(exc)}
            raise HTTPException(status, detail) from exc
        except WaitTimeout as exc:
            raise HTTPException(504, {"error": "wait_timeout", "message": f"row {name}: {exc}"}) from exc
        except ApiError as exc:
            raise HTTPException(502, {"error": "service", "status": exc.status_code, "message": str(exc)}) from exc
        except httpx.TransportError as exc:
            url = settings.api_url or os.environ.get("ROLLOUTS_API_URL")
            message = f"row {name}: the service at {url} is unreachable: {exc!r}"
            raise HTTPException(503, {"error": "unreachable", "message": message}) from exc


def row_name(row: dict[str, Any]) -> str:
    """How errors name the row: its key, else NeMo Gym's task and rollout indices."""
    if row.get(KEY_FIELD) is not None:
        return str(row[KEY_FIELD])
    return f"{row.get(TASK_INDEX_KEY_NAME, '?')}/{row.get(ROLLOUT_INDEX_KEY_NAME, '?')}"


def job_body(
    row: dict[str, Any], params: NeMoGymResponseCreateParamsNonStreaming, settings: BridgeSettings, prefix: str = ""
) -> tuple[dict[str, Any], str]:
    """The row's job and its idempotency key; RowError naming the field when the row has no usable task.

    The key is stable only when the row says what it is (`rollouts_key`, with NeMo Gym's rollout index for its
    repeats): NeMo Gym's task index repeats every epoch, and a key made of it alone would hand a later step the
    first step's jobs. Rows of one task index are one group of the service (`sample_index` = the rollout index).
    """
    name = row_name(row)
    if row.get(TASK_FIELD) is None:
        raise RowError(name, prefix + TASK_FIELD, "missing: the service task this row runs")
    task = task_from(row[TASK_FIELD], name, prefix + TASK_FIELD)
    task_index, rollout_index = row.get(TASK_INDEX_KEY_NAME), row.get(ROLLOUT_INDEX_KEY_NAME)
    body: dict[str, Any] = {
        "task": task,
        "sampling": sampling_of(params, settings.max_tokens_per_turn),
        "metadata": {
            "trainer": TRAINER,
            "run_id": settings.run_id,
            "task_index": task_index,
            "rollout_index": rollout_index,
            "rollouts_key": row.get(KEY_FIELD),
        },
    }
    if task_index is not None:
        body["group_id"] = group_id(settings.run_id, TRAINER, row.get(KEY_FIELD), task_index)
        body["sample_index"] = int(rollout_index or 0)
    if settings.model:
        body["model"] = settings.model
    if row.get(KEY_FIELD) is not None:
        key = idempotency_key(settings.run_id, TRAINER, row[KEY_FIELD], rollout_index)
    else:
        key = idempotency_key(settings.run_id, TRAINER, uuid.uuid4().hex)
    return body, key


def sampling_of(params: NeMoGymResponseCreateParamsNonStreaming, max_tokens_per_turn: int | None) -> dict[str, Any]:
    """The Responses API's sampling fields under the service's names: `temperature`, `top_p`, `max_output_tokens`
    (per turn, unless the settings' `max_tokens_per_turn`), and the seed NeMo Gym's `num_repeats_add_seed` puts in
    `metadata.extra_body`."""
    sampling: dict[str, Any] = {}
    if params.temperature is not None:
        sampling["temperature"] = params.temperature
    if params.top_p is not None:
        sampling["top_p"] = params.top_p
    limit = max_tokens_per_turn or params.max_output_tokens
    if limit is not None:
        sampling["max_tokens"] = int(limit)
    extra = (params.metadata or {}).get("extra_body")
    if extra:
        try:
            seed = json.loads(extra).get("seed")
        except (ValueError, AttributeError):
            seed = None
        if isinstance(seed, int):
            sampling["seed"] = seed
    return sampling


def response_of(job: Job, params: NeMoGymResponseCreateParamsNonStreaming, settings: BridgeSettings) -> NeMoGymResponse:
    """The record as NeMo Gym's response: its items, and usage summed over its calls."""
    items, calls = job_items(job, settings.on_segments)
    prompt = sum(len(c.prompt_token_ids) for c in calls)
    generated = sum(len(c.generation_token_ids) for c in calls)
    turns = (job.trajectory or {}).get("turns") or []
    model = next((t.get("model") for t in turns if t.get("model")), None) or settings.model or "rollouts"
    return NeMoGymResponse(
        id=f"resp_{job.id}",
        created_at=float(job.created_at or time.time()),
        model=model,
        object="response",
        output=items,
        parallel_tool_calls=params.parallel_tool_calls,
        tool_choice=params.tool_choice,
        tools=params.tools,
        usage=NeMoGymResponseUsage(
            input_tokens=prompt,
            output_tokens=generated,
            total_tokens=prompt + generated,
            input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=0),
            output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=0),
        ),
    )


if __name__ == "__main__":
    RolloutsAgent.run_webserver()
