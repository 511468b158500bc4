"""What a trainer submits: the job request schema, validated at the API.

The spec is stored as the plain dict the API validated (msgpack); a stage worker parses it back
once per stage (`JobRequest.from_stored`), so every field has one meaning and one type across
processes.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

# apply_chat_template's own arguments and the variables it sets: a job must not redefine how it renders.
_RENDER_ARGUMENTS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        # the tokenizer's special tokens, which transformers passes to every template itself
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
    }
)
_TEMPLATE_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

# A published data set's format -> the kind that runs its rows (shared/kinds/formats.py reads their fields).
FORMAT_KINDS: dict[str, str] = {
    "gsm8k": "math",
    "math": "math",
    "answer": "math",
    "mbpp": "code",
    "humaneval": "code",
    "swebench": "swe",
}
FORMATS = tuple(FORMAT_KINDS)

# Groups of a batch are named "b.<batch id>.<prompt index>" (shared/batches/spec.py).
BATCH_GROUP_PREFIX = "b."
# Validation context of a spec read back from Redis rather than submitted.
_STORED = "stored"


class SamplingParams(BaseModel):
    """How every turn is sampled, under vLLM's SamplingParams names.

    Every field is sent on every request, unset ones at these neutral defaults, so the served
    model's generation_config (penalties, top_k, ...) never changes sampling behind the trainer's back.
    """

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, description="-1 or 0 disables top-k.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, gt=0, description="Per turn; never more than the context left.")
    stop: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list, max_length=16, description="Stop strings (the turn's tokens up to the match are kept)."
    )
    stop_token_ids: list[int] = Field(default_factory=list, max_length=64)
    seed: int | None = Field(
        default=None, ge=0, le=2**63 - 1, description="Turn k of the trajectory samples with seed + k: reproducible."
    )
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0, description="1.0: off.")
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)


class Limits(BaseModel):
    """Per-job limits; unset time limits take the deployment's defaults."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=16, gt=0, le=10_000)
    max_tokens: int = Field(default=8192, gt=0, description="Total tokens of the trajectory (prompt included).")
    max_prompt_tokens: int | None = Field(
        default=None,
        gt=0,
        description="The rendered first prompt's tokens at most: a longer one fails the job (prompt_too_long) before "
        "any generation. A trainer that pads prompts to a fixed length sets it to that length.",
    )
    init_timeout_s: float | None = Field(default=None, gt=0)
    rollout_timeout_s: float | None = Field(default=None, gt=0)
    eval_timeout_s: float | None = Field(default=None, gt=0)
    total_timeout_s: float | None = Field(default=None, gt=0)


class GivenOutput(BaseModel):
    """Evaluate this instead of sampling: the rollout stage skips the LLM and hands it to eval as is."""

    model_config = ConfigDict(extra="forbid")

    reference: bool = Field(
        default=False, description="The task's own reference: the gold patch, reference answer or canonical solution."
    )
    output: str | None = Field(
        default=None,
        max_length=4 * 1024 * 1024,
        description="An answer (math), a solution file (code) or a patch (swe), judged as the model's would be.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> GivenOutput:
        if self.reference == (self.output is not None):
            raise ValueError("give exactly one of reference: true or output")
        return self


class JobRequest(BaseModel):
    """One trajectory of one task instance."""

    model_config = ConfigDict(extra="forbid")

    task: dict[str, Any] = Field(description="The task instance; `kind` names its task kind (math, code, swe, ...).")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The served model to sample from (a registered backend's model). Unset: any backend's.",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        max_length=16,
        description='Variables for the model\'s chat template on every turn, e.g. {"enable_thinking": false} (Qwen3).',
    )
    limits: Limits = Field(default_factory=Limits)
    group_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    sample_index: int | None = Field(default=None, ge=0)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Opaque to the service; returned as given.")
    given: GivenOutput | None = Field(
        default=None, description="Evaluate a given output (or the task's reference) without sampling: validation."
    )
    agent: Literal["builtin", "external"] = Field(
        default="builtin",
        description="Who drives the rollout: the service's agent loop, or an agent of your own through the job's "
        "OpenAI-compatible endpoint (`agent.base_url` and `agent.api_key` in the submit answer; docs/TRAJECTORY.md).",
    )

    @classmethod
    def from_stored(cls, spec: dict[str, Any]) -> JobRequest:
        """A stored spec, as a stage reads it. Batches store their own jobs under the group ids a
        trainer may not submit, so that one check is the submission's, not the schema's."""
        return cls.model_validate(spec, context={_STORED: True})

    @field_validator("group_id")
    @classmethod
    def _group_not_reserved(cls, group_id: str | None, info: ValidationInfo) -> str | None:
        stored = bool(info.context and info.context.get(_STORED))
        if group_id is not None and group_id.startswith(BATCH_GROUP_PREFIX) and not stored:
            raise ValueError(f"group ids starting with {BATCH_GROUP_PREFIX!r} are reserved for batches")
        return group_id

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Plain template variables: identifiers with scalar values, none of apply_chat_template's own arguments."""
        for name, value in kwargs.items():
            if not _TEMPLATE_VARIABLE.match(name):
                raise ValueError(f"{name!r} is not a template variable name (letters, digits, _; at most 64)")
            if name in _RENDER_ARGUMENTS:
                raise ValueError(f"{name!r}: the service sets this itself, it is not a template variable")
            scalar = value is None or isinstance(value, (bool, int, float))
            if not (scalar or (isinstance(value, str) and len(value) <= 4096)):
                raise ValueError(f"{name!r}: a template variable is a boolean, number, string (<= 4096) or null")
        return kwargs

    @field_validator("task")
    @classmethod
    def _task_has_kind(cls, task: dict[str, Any]) -> dict[str, Any]:
        if "kind" not in task and task.get("format") in FORMAT_KINDS:  # a published row: its format says the kind
            task = {**task, "kind": FORMAT_KINDS[task["format"]]}
        kind = task.get("kind")
        if not isinstance(kind, str) or not kind:
            raise ValueError("task.kind (or task.format of a published row) is required; kind a non-empty string")
        return task
