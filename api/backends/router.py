"""Register, list, heartbeat, drain and remove LLM backends (vLLM servers) of the pool."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Body, Depends, HTTPException, Path, Response, status

from api.backends.schemas import BackendList, BackendRegistration, BackendView, DrainRequest
from api.deps import get_pool, require_admin, require_auth
from shared.backend_pool import Backend, BackendPool, NotAModelServer
from shared.weights.registration import catch_up_in_background
from shared.weights.registration import register_backend as register

router = APIRouter(prefix="/v1/backends", tags=["backends"])

BackendId = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Backend id")]


def _not_found(backend_id: str, hint: str = "") -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no backend {backend_id!r}{hint}")


def _found(backend: Backend | None, backend_id: str) -> BackendView:
    """The backend's view, or 404 naming the id."""
    if backend is None:
        raise _not_found(backend_id)
    return BackendView.of(backend)


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
    try:
        registered = register(pool, body.url, body.model, body.capacity, body.labels, body.id, body.tokenizer)
    except NotAModelServer as exc:
        raise exc.within("body") from None
    if registered.behind:
        background.add_task(catch_up_in_background, pool, registered.backend.id)
    return BackendView.of(registered.backend)


@router.get(
    "",
    response_model=BackendList,
    dependencies=[Depends(require_auth)],
    summary="Every backend with its in-flight count and health",
)
def list_backends(pool: BackendPool = Depends(get_pool)) -> BackendList:
    return BackendList.of(pool.backends())


@router.get("/{backend_id}", response_model=BackendView, dependencies=[Depends(require_auth)])
def get_backend(backend_id: BackendId, pool: BackendPool = Depends(get_pool)) -> BackendView:
    return _found(pool.get(backend_id), backend_id)


@router.delete(
    "/{backend_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=[Depends(require_admin)],
    summary="Remove a backend; its trajectories re-pin at their next call",
)
def delete_backend(backend_id: BackendId, pool: BackendPool = Depends(get_pool)) -> Response:
    if not pool.deregister(backend_id):
        raise _not_found(backend_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{backend_id}/heartbeat", response_model=BackendView, dependencies=[Depends(require_admin)])
def heartbeat(backend_id: BackendId, pool: BackendPool = Depends(get_pool)) -> BackendView:
    if not pool.heartbeat(backend_id):
        raise _not_found(backend_id, "; register it again")
    return _found(pool.get(backend_id), backend_id)


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
        raise _not_found(backend_id)
    return _found(pool.get(backend_id), backend_id)
