"""Update the policy weights of every backend of a model in one call; read the model's current version."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field
from redis import Redis
from redis.exceptions import LockError

from api.deps import get_redis, require_admin, require_auth
from api.routes.backends import get_pool
from shared.backend_pool import BackendPool
from shared.errors import ValidationError
from shared.weights import (
    Checkpoint,
    NoBackendsForModel,
    UpdateInProgress,
    UpdateReport,
    WeightVersions,
    update_model,
)
from shared.weights.versions import VersionBackwards

router = APIRouter(prefix="/v1/models", tags=["weights"])

# The bytes form's path, for the body-size middleware (its own, larger limit: Settings.max_weight_bytes).
WEIGHTS_PATH = r"/v1/models/.+/weights"
SAFETENSORS = "application/octet-stream"

ModelName = Annotated[str, Path(min_length=1, max_length=256, description="The served model name backends registered")]


class WeightUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[!-~]+$",
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

    version: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[!-~]+$",
        description="The label of the weights the trainer loaded into its servers (e.g. its step, `step-12`); "
        "new to the model, or its current one (a retry); an older one is refused",
    )
    backends: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")]] = Field(
        min_length=1,
        max_length=1024,
        description="Ids of the registered backends of the model that now serve these weights",
    )
    owner: str = Field(
        default="trainer",
        min_length=1,
        max_length=128,
        pattern=r"^[!-~]+$",
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


@router.post(
    "/{model:path}/weights",
    response_model=WeightUpdateResult,
    dependencies=[Depends(require_admin)],
    summary="Load a checkpoint into every backend of the model under a new version",
    responses={
        404: {"description": "No backend of the model is registered"},
        409: {"description": "Another update of the model is running"},
    },
)
def update_weights(
    model: ModelName, body: WeightUpdate, redis: Redis = Depends(get_redis), pool: BackendPool = Depends(get_pool)
) -> WeightUpdateResult:
    """Pause, reload, reset the prefix cache, label, resume, on every backend at once.

    Refused before any backend is touched: a version that goes backwards or a checkpoint that is
    missing, unreadable or does not fit the served model (422), a second concurrent update of the
    same model (409: it does not wait). A backend that fails leaves the pool (`removed_from_pool`).
    """
    checkpoint = Checkpoint(path=body.path, version=body.version, pause_mode=body.pause_mode, lora=body.lora)
    return _result(_update(redis, pool, model, checkpoint))


@router.put(
    "/{model:path}/weights",
    response_model=WeightUpdateResult,
    dependencies=[Depends(require_admin)],
    summary="Load weights sent as one safetensors file into every backend of the model (no shared disk)",
    openapi_extra={
        "requestBody": {"required": True, "content": {SAFETENSORS: {"schema": {"type": "string", "format": "binary"}}}}
    },
    responses={
        404: {"description": "No backend of the model is registered"},
        409: {"description": "Another update of the model is running"},
        413: {"description": "The body is larger than Settings.max_weight_bytes"},
        415: {"description": "The body is not application/octet-stream"},
    },
)
async def upload_weights(
    model: ModelName,
    request: Request,
    version: Annotated[
        str,
        Query(
            min_length=1,
            max_length=128,
            pattern=r"^[!-~]+$",
            description="As in POST: the label of every token these weights sample",
        ),
    ],
    pause_mode: Annotated[Literal["keep", "wait", "abort"], Query(description="As in POST")] = "wait",
    redis: Redis = Depends(get_redis),
    pool: BackendPool = Depends(get_pool),
) -> WeightUpdateResult:
    """The POST update's steps, with the body (one safetensors file, every tensor of the model) as the weights.

    The service checks the names and shapes against the served model (422 on `body`), then sends
    the bytes to each backend's worker extension (cli/vllm_extension/) instead of a path.
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != SAFETENSORS:
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            detail=f"send the safetensors file as {SAFETENSORS}, not {content_type or 'no type'}",
        )
    data = await request.body()
    label = f"upload:sha256:{hashlib.sha256(data).hexdigest()[:16]}"
    checkpoint = Checkpoint(path=label, version=version, pause_mode=pause_mode, data=data)
    return _result(await run_in_threadpool(_update, redis, pool, model, checkpoint))


def _update(redis: Redis, pool: BackendPool, model: str, checkpoint: Checkpoint) -> UpdateReport:
    try:
        return update_model(redis, pool, model, checkpoint)
    except UpdateInProgress as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
    except NoBackendsForModel as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc)) from None


def _result(report: UpdateReport) -> WeightUpdateResult:
    return WeightUpdateResult(
        model=report.model,
        version=report.version,
        seq=report.seq,
        seconds=report.seconds,
        backends=[
            BackendUpdate(
                id=o.id,
                url=o.url,
                status=o.status,
                seconds=o.seconds,
                error=o.error,  # type: ignore[arg-type]
                removed_from_pool=o.removed_from_pool,
            )
            for o in report.backends
        ],
    )


@router.post(
    "/{model:path}/weights/declare",
    response_model=VersionDeclared,
    dependencies=[Depends(require_admin)],
    summary="Record that a trainer's own backends of the model now serve a version (nothing is loaded)",
    responses={
        404: {"description": "A named backend is not registered"},
        409: {"description": "A service weight update of the model is running"},
    },
)
def declare_weights(
    model: ModelName, body: VersionDeclaration, redis: Redis = Depends(get_redis), pool: BackendPool = Depends(get_pool)
) -> VersionDeclared:
    """For a trainer that runs its own vLLM servers and updates their weights in place (verl, SkyRL): the
    version becomes the model's current one and the named backends' label, so every later turn they sample
    records it and `max_staleness` counts from it. Refused before anything is written: a backend that is
    not registered (404) or serves another model (422, `body.backends`), a version that goes backwards
    (422, `body.version`)."""
    for backend_id in body.backends:
        backend = pool.get(backend_id)
        if backend is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"body.backends: no backend {backend_id!r}")
        if backend.model != model:
            raise ValidationError(
                f"backend {backend_id!r} serves model {backend.model!r}, not {model!r}", ("body", "backends")
            )
    versions = WeightVersions(redis, pool.keys)
    try:
        with redis.lock(pool.keys.weight_lock(model), timeout=30, blocking_timeout=5):
            try:
                seq = versions.declare(model, body.version, body.owner)
            except VersionBackwards as exc:
                raise ValidationError(str(exc), ("body", "version")) from None
            declared = [b for b in body.backends if pool.declare_version(b, body.version)]
    except LockError:
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"an update of model {model!r} is running: declare again after it"
        ) from None
    return VersionDeclared(model=model, version=body.version, seq=seq, backends=declared)


@router.get(
    "/{model:path}/weights",
    response_model=CurrentWeights,
    dependencies=[Depends(require_auth)],
    summary="The model's current weight version and its sequence number",
)
def current_weights(
    model: ModelName, redis: Redis = Depends(get_redis), pool: BackendPool = Depends(get_pool)
) -> CurrentWeights:
    current = WeightVersions(redis, pool.keys).current(model)
    return CurrentWeights(
        model=model, version=current.version, seq=current.seq, path=current.path, applied_at=current.applied_at
    )
