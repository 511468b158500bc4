"""Register, list, heartbeat, drain and remove LLM backends (vLLM servers) of the pool."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Body, Depends, HTTPException, Path, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field
from redis import Redis
from redis.exceptions import LockError, RedisError

from api.deps import get_keys, get_redis, get_settings, require_admin, require_auth
from shared.backend_pool import Backend, BackendPool, NotAModelServer, check_serves_model
from shared.config import Settings
from shared.keys import Keys
from shared.weights.update import catch_up
from shared.weights.versions import TRAINER_OWNER, WeightVersions, stale_reason

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/backends", tags=["backends"])

BackendId = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Backend id")]


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


def get_pool(
    request: Request,
    redis: Redis = Depends(get_redis),
    keys: Keys = Depends(get_keys),
    settings: Settings = Depends(get_settings),
) -> BackendPool:
    """One pool per app (its Lua scripts are registered once), rebuilt if the Redis client changes."""
    pool = getattr(request.app.state, "backend_pool", None)
    if pool is None or pool.redis is not redis:
        pool = request.app.state.backend_pool = BackendPool(redis, keys, settings)
    return pool


def _found(backend: Backend | None, backend_id: str) -> Backend:
    if backend is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no backend {backend_id!r}")
    return backend


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=BackendView,
    dependencies=[Depends(require_admin)],
    summary="Register (or refresh) a backend",
)
def register_backend(
    body: BackendRegistration, background: BackgroundTasks, pool: BackendPool = Depends(get_pool)
) -> BackendView:
    """Refused (422) unless the URL is an OpenAI-compatible server that serves the named model. One that reports
    a weight version other than the model's current one is registered unhealthy (`stale weights`), and the
    current weights are loaded into it after the answer; it rejoins the pool once they are in. A backend
    labelled `owner: trainer` (a trainer's own server, docs/TRAINERS.md) is never compared or loaded."""
    timeout = pool.settings.llm_probe_timeout_s
    try:
        root = check_serves_model(body.url, body.model, timeout, pool.settings.backend_key)
    except NotAModelServer as exc:
        raise exc.within("body") from None
    stale = (
        ""
        if body.labels.get("owner") == TRAINER_OWNER  # its trainer loads its weights: the service never does
        else stale_reason(
            WeightVersions(pool.redis, pool.keys), body.model, body.url, timeout, pool.settings.backend_key
        )
    )
    backend = pool.register(
        body.url,
        body.model,
        body.capacity,
        body.labels,
        body.id,
        tokenizer=body.tokenizer or root,
        unhealthy_reason=stale,
    )
    if stale:
        background.add_task(_catch_up, pool, backend.id)
    return BackendView.of(backend)


def _catch_up(pool: BackendPool, backend_id: str) -> None:
    """After the answer: a registration must not wait minutes for a reload."""
    try:
        outcome = catch_up(pool.redis, pool, backend_id)
    except (RedisError, LockError) as exc:  # left stale: the next registration tries again
        log.warning("backend %s: its current weights were not loaded: %s: %s", backend_id, type(exc).__name__, exc)
        return
    if outcome is not None:
        log.info("backend %s registered behind the current weights: %s %s", backend_id, outcome.status, outcome.error)


@router.get(
    "",
    response_model=BackendList,
    dependencies=[Depends(require_auth)],
    summary="Every backend with its in-flight count and health",
)
def list_backends(pool: BackendPool = Depends(get_pool)) -> BackendList:
    backends = pool.backends()
    return BackendList(
        backends=[BackendView.of(b) for b in backends],
        inflight=sum(b.inflight for b in backends),
        selectable=sum(1 for b in backends if b.healthy and not b.draining),
    )


@router.get("/{backend_id}", response_model=BackendView, dependencies=[Depends(require_auth)])
def get_backend(backend_id: BackendId, pool: BackendPool = Depends(get_pool)) -> BackendView:
    return BackendView.of(_found(pool.get(backend_id), backend_id))


@router.delete(
    "/{backend_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=[Depends(require_admin)],
    summary="Remove a backend; its trajectories re-pin at their next call",
)
def delete_backend(backend_id: BackendId, pool: BackendPool = Depends(get_pool)) -> Response:
    if not pool.deregister(backend_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no backend {backend_id!r}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{backend_id}/heartbeat", response_model=BackendView, dependencies=[Depends(require_admin)])
def heartbeat(backend_id: BackendId, pool: BackendPool = Depends(get_pool)) -> BackendView:
    if not pool.heartbeat(backend_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no backend {backend_id!r}; register it again")
    return BackendView.of(_found(pool.get(backend_id), backend_id))


@router.post(
    "/{backend_id}/drain",
    response_model=BackendView,
    dependencies=[Depends(require_admin)],
    summary="Stop new pins (existing trajectories finish); draining=false reopens",
)
def drain(
    backend_id: BackendId,
    body: Annotated[DrainRequest | None, Body()] = None,
    pool: BackendPool = Depends(get_pool),
) -> BackendView:
    if not pool.drain(backend_id, (body or DrainRequest()).draining):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no backend {backend_id!r}")
    return BackendView.of(_found(pool.get(backend_id), backend_id))
