"""Request and response shapes of the backends API (the pool itself: shared/backend_pool/)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from shared.backend_pool import Backend


class BackendRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        pattern=r"^https?://[!-.0-~]+(/[!-~]*)?$",
        max_length=2048,
        description="Base URL of a vLLM OpenAI-compatible server, e.g. http://node7:8000",
    )
    model: str = Field(
        min_length=1, max_length=256, description="Served model name, as the server lists it in GET /v1/models"
    )
    capacity: float = Field(default=1.0, gt=0, le=1_000_000, description="Relative weight: a 2 takes twice the load")
    labels: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=32
    )
    id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="Default: derived from the URL, so re-registering is idempotent",
    )
    tokenizer: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Directory (readable by the rollout workers) with the served model's tokenizer and chat "
        "template. Default: the model's local path that vLLM reports (`root` in GET /v1/models).",
    )


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    draining: bool = Field(default=True, description="false reopens the backend to new pins")


class BackendView(BaseModel):
    id: str
    url: str
    model: str
    tokenizer: str
    capacity: float
    labels: dict[str, str]
    healthy: bool
    draining: bool
    inflight: int = Field(description="Trajectories pinned to and charged to this backend now")
    registered_at: float
    last_heartbeat: float
    unhealthy_reason: str
    weight_version: str = Field(
        description="The version its owner declared it serves (POST /v1/models/{model}/weights/declare); "
        "empty for a backend whose weights the service loads"
    )

    @classmethod
    def of(cls, backend: Backend) -> BackendView:
        return cls(**backend.to_dict())


class BackendList(BaseModel):
    backends: list[BackendView]
    inflight: int = Field(description="Sum of in-flight trajectories over every backend")
    selectable: int = Field(description="Healthy, non-draining backends open to new pins")

    @classmethod
    def of(cls, backends: list[Backend]) -> BackendList:
        return cls(
            backends=[BackendView.of(b) for b in backends],
            inflight=sum(b.inflight for b in backends),
            selectable=sum(1 for b in backends if b.healthy and not b.draining),
        )
