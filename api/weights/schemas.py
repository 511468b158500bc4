"""Request and response shapes of the weights API (the update itself: shared/weights/)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# A version's label, and who declared one: printable ASCII without spaces, as vLLM's weight_versions keeps it.
Label = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[!-~]+$")]


class WeightUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Label = Field(
        description="The label every token sampled by these weights will carry (vLLM's "
        "weight_versions). New to the model, or its current one (a retry); an older one is refused.",
    )
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="Absolute directory of a Hugging Face checkpoint (*.safetensors) that the "
        "backends and the API can read; with `lora`, the adapter's directory.",
    )
    pause_mode: Literal["keep", "wait", "abort"] = Field(
        default="wait",
        description="Running requests during the swap: wait (finish first), keep (frozen, then "
        "continued on the new weights), abort (ended with finish_reason abort).",
    )
    lora: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Load `path` as this LoRA adapter (in place) instead of full weights; "
        "vLLM must run with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.",
    )


class BackendUpdate(BaseModel):
    id: str
    url: str
    status: Literal["updated", "failed"]
    seconds: dict[str, float] = Field(
        description="Per step, in order: pause, reload, reset_prefix_cache, set_version, resume (up to a failed one)"
    )
    error: str
    removed_from_pool: bool = Field(description="The backend failed and left the pool (unhealthy: stale weights)")


class WeightUpdateResult(BaseModel):
    model: str
    version: str
    seq: int = Field(description="The version's place in the model's order (1, 2, ...); 0: no backend took it")
    backends: list[BackendUpdate]
    seconds: float


class VersionDeclaration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Label = Field(
        description="The label of the weights the trainer loaded into its servers (e.g. its step, `step-12`); "
        "new to the model, or its current one (a retry); an older one is refused",
    )
    backends: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")]] = Field(
        min_length=1,
        max_length=1024,
        description="Ids of the registered backends of the model that now serve these weights",
    )
    owner: Label = Field(
        default="trainer",
        description="Who updated them (a trainer run id); kept as the version's origin",
    )


class VersionDeclared(BaseModel):
    model: str
    version: str
    seq: int = Field(description="The version's place in the model's order: what max_staleness counts in")
    backends: list[str]


class CurrentWeights(BaseModel):
    model: str
    version: str | None = Field(description="The last version applied through the service; null: none yet")
    seq: int
    path: str
    applied_at: float
