"""Update the policy weights of every backend of a model in one call; declare a trainer's own; read the current."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool

from api.deps import get_pool, require_admin, require_auth
from api.weights.schemas import (
    BackendUpdate,
    CurrentWeights,
    VersionDeclaration,
    VersionDeclared,
    WeightUpdate,
    WeightUpdateResult,
)
from shared.backend_pool import BackendPool
from shared.weights import Checkpoint, UpdateReport, update_model
from shared.weights.declare import current_version, declare_version

router = APIRouter(prefix="/v1/models", tags=["weights"])

# The bytes form's path, for the body-size middleware (its own, larger limit: Settings.max_weight_bytes).
WEIGHTS_PATH = r"/v1/models/.+/weights"
SAFETENSORS = "application/octet-stream"

ModelName = Annotated[str, Path(min_length=1, max_length=256, description="The served model name backends registered")]
_UPDATE_REFUSALS = {
    404: {"description": "No backend of the model is registered"},
    409: {"description": "Another update of the model is running"},
}


@router.post(
    "/{model:path}/weights",
    response_model=WeightUpdateResult,
    dependencies=[Depends(require_admin)],
    summary="Load a checkpoint into every backend of the model under a new version",
    responses=_UPDATE_REFUSALS,
)
def update_weights(model: ModelName, body: WeightUpdate, pool: BackendPool = Depends(get_pool)) -> WeightUpdateResult:
    """Pause, reload, reset the prefix cache, label, resume, on every backend at once.

    Refused before any backend is touched: a version that goes backwards or a checkpoint that is
    missing, unreadable or does not fit the served model (422), a second concurrent update of the
    same model (409: it does not wait). A backend that fails leaves the pool (`removed_from_pool`).
    """
    checkpoint = Checkpoint(path=body.path, version=body.version, pause_mode=body.pause_mode, lora=body.lora)
    return _result(update_model(pool, model, checkpoint))


@router.put(
    "/{model:path}/weights",
    response_model=WeightUpdateResult,
    dependencies=[Depends(require_admin)],
    summary="Load weights sent as one safetensors file into every backend of the model (no shared disk)",
    openapi_extra={
        "requestBody": {"required": True, "content": {SAFETENSORS: {"schema": {"type": "string", "format": "binary"}}}}
    },
    responses={
        **_UPDATE_REFUSALS,
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
    return _result(await run_in_threadpool(update_model, pool, model, checkpoint))


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
    model: ModelName, body: VersionDeclaration, pool: BackendPool = Depends(get_pool)
) -> VersionDeclared:
    """For a trainer that runs its own vLLM servers and updates their weights in place (verl, SkyRL): the
    version becomes the model's current one and the named backends' label, so every later turn they sample
    records it and `max_staleness` counts from it. Refused before anything is written: a backend that is
    not registered (404) or serves another model (422, `body.backends`), a version that goes backwards
    (422, `body.version`)."""
    declared = declare_version(pool, model, body.version, body.backends, body.owner)
    return VersionDeclared(model=model, version=body.version, seq=declared.seq, backends=declared.backends)


@router.get(
    "/{model:path}/weights",
    response_model=CurrentWeights,
    dependencies=[Depends(require_auth)],
    summary="The model's current weight version and its sequence number",
)
def current_weights(model: ModelName, pool: BackendPool = Depends(get_pool)) -> CurrentWeights:
    current = current_version(pool, model)
    return CurrentWeights(
        model=model, version=current.version, seq=current.seq, path=current.path, applied_at=current.applied_at
    )
