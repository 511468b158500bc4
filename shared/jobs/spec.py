"""What a trainer submits: the job request schema, validated once at the API.

Workers read the stored spec as a plain dict (msgpack), so only the API pays
for validation and every field has one meaning across processes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


# Groups of a batch are named "b.<batch id>.<prompt index>" (shared/batches/spec.py).
BATCH_GROUP_PREFIX = "b."


class SamplingParams(BaseModel):
    """Passed through to the LLM backend (vLLM's /v1/completions fields)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, description="-1 disables top-k (vLLM's convention).")
    max_tokens: int | None = Field(default=None, gt=0, description="Per turn; never more than the context left.")
    stop_token_ids: list[int] = Field(default_factory=list, max_length=64)
    seed: int | None = Field(default=None, ge=0)


class Limits(BaseModel):
    """Per-job limits; unset time limits take the deployment's defaults."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=16, gt=0, le=10_000)
    max_tokens: int = Field(default=8192, gt=0, description="Total tokens of the trajectory (prompt included).")
    init_timeout_s: float | None = Field(default=None, gt=0)
    rollout_timeout_s: float | None = Field(default=None, gt=0)
    eval_timeout_s: float | None = Field(default=None, gt=0)
    total_timeout_s: float | None = Field(default=None, gt=0)


class JobRequest(BaseModel):
    """One trajectory of one task instance."""

    model_config = ConfigDict(extra="forbid")

    task: dict[str, Any] = Field(description="The task instance; `kind` names its task kind (math, code, swe, ...).")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    limits: Limits = Field(default_factory=Limits)
    group_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    sample_index: int | None = Field(default=None, ge=0)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Opaque to the service; returned as given.")

    @field_validator("group_id")
    @classmethod
    def _group_not_reserved(cls, group_id: str | None) -> str | None:
        if group_id is not None and group_id.startswith(BATCH_GROUP_PREFIX):
            raise ValueError(f"group ids starting with {BATCH_GROUP_PREFIX!r} are reserved for batches")
        return group_id

    @field_validator("task")
    @classmethod
    def _task_has_kind(cls, task: dict[str, Any]) -> dict[str, Any]:
        kind = task.get("kind")
        if not isinstance(kind, str) or not kind:
            raise ValueError("task.kind is required and must be a non-empty string")
        return task
