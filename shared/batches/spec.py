"""What a trainer submits to create a batch, validated once at the API.

A batch is a list of prompts, `n_samples` jobs per prompt (one GRPO group) and a
target: every prompt (`all`), or `min_informative_groups` groups whose rewards
are not all equal (DAPO dynamic sampling). The pool is copied into Redis at
creation, so no process (and no file the workers cannot see) owns it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.jobs.spec import BATCH_GROUP_PREFIX, Limits, SamplingParams

# A group id is `b.<batch id>.<prompt index>`: the job pipeline's group id pattern allows it,
# and any process can tell from a job's group id alone which batch and prompt it belongs to.
GROUP_PREFIX = BATCH_GROUP_PREFIX  # one definition: the jobs API refuses it for user groups


class BatchRequest(BaseModel):
    """POST /v1/batches. Exactly one of `prompts` and `prompts_path`."""

    model_config = ConfigDict(extra="forbid")

    prompts: list[dict[str, Any]] | None = Field(
        default=None,
        description="The pool, inline: each item a task (with `kind`) or {task, sampling?, limits?, metadata?}.",
    )
    prompts_path: str | None = Field(
        default=None, description="A JSONL file on the server's filesystem, one prompt item per line."
    )
    n_samples: int = Field(default=8, ge=1, le=1024, description="Jobs per prompt: the GRPO group size.")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    limits: Limits = Field(default_factory=Limits)
    min_informative_groups: int | None = Field(
        default=None,
        ge=1,
        description="DAPO target: stop once this many groups had unequal rewards. Unset: run every prompt once.",
    )
    max_groups_in_flight: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description=(
            "Groups running at once, kept at this level by replenishment. Default: the target count or the "
            "server's batch_default_groups_in_flight, whichever is less; capped at batch_max_groups_in_flight."
        ),
    )
    on_target: Literal["cancel", "keep"] = Field(
        default="cancel", description="What happens to groups still running when the target is met."
    )
    advantages: Literal["grpo", "mean", "none"] = Field(
        default="grpo",
        description="Per-sample advantages: (r - mean) / (std + eps), r - mean (no std scaling), or none.",
    )
    reward_epsilon: float = Field(
        default=1e-6, ge=0.0, description="Rewards closer than this count as equal (the group is uninformative)."
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="AReaL's bound, in weight updates: a sample whose oldest turn was sampled by weights more than "
        "this many updates (POST /v1/models/{model}/weights) older than the model's current ones is not trainable: "
        "its group counts as `stale` and the next prompt runs instead. Unset: no bound.",
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Opaque to the service; returned as given.")

    @model_validator(mode="after")
    def _one_pool(self) -> BatchRequest:
        if (self.prompts is None) == (self.prompts_path is None):
            raise ValueError("give exactly one of prompts and prompts_path")
        if self.prompts is not None and not self.prompts:
            raise ValueError("prompts: no prompt given")
        return self

    @property
    def mode(self) -> str:
        return "all" if self.min_informative_groups is None else "dapo"


class PromptItem(BaseModel):
    """One prompt of a batch; its sampling and limits, when given, replace the batch's."""

    model_config = ConfigDict(extra="forbid")

    task: dict[str, Any]
    sampling: SamplingParams | None = None
    limits: Limits | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def normalise_prompt_item(item: Any) -> dict[str, Any]:
    """A bare task (has `kind`) becomes {"task": item}; anything else must already be a PromptItem."""
    if isinstance(item, dict) and "task" not in item and "kind" in item:
        return {"task": item}
    return item


def group_id(batch_id: str, prompt_index: int) -> str:
    return f"{GROUP_PREFIX}{batch_id}.{prompt_index}"


def parse_group_id(value: str | None) -> tuple[str, int] | None:
    """(batch id, prompt index) of a batch group id; None for any other group (or none)."""
    if not value or not value.startswith(GROUP_PREFIX):
        return None
    batch_id, _, index = value[len(GROUP_PREFIX) :].rpartition(".")
    if not batch_id or not index.isdigit():
        return None
    return batch_id, int(index)


def idempotency_key(batch_id: str, prompt_index: int, sample_index: int) -> str:
    """Re-submitting a group after a crash finds the jobs already made instead of duplicating them."""
    return f"batch/{batch_id}/prompt/{prompt_index}/sample/{sample_index}"
