"""Batches: create (GRPO groups, DAPO dynamic sampling), read, stream completed groups, cancel.

The two streaming endpoints are async and wait on the batch's stream (shared/batches/stream.py), so a
waiting trainer holds no threadpool thread; building the group views (a few Redis reads) runs in the threadpool.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, status
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError as PydanticValidationError
from starlette.concurrency import run_in_threadpool

from api.deps import get_batches, get_group_stream, require_admin, require_auth, require_room, submitter_access
from api.errors import Refusal
from api.json_body import load_json_body
from api.negotiation import respond
from shared.batches.prompts import load_prompts
from shared.batches.replenish import cancel_groups, start_batch
from shared.batches.spec import BatchRequest
from shared.batches.store import BatchStore, group_views
from shared.batches.stream import GroupStream
from shared.batches.views import batch_view
from shared.errors import NotPermitted, ValidationError
from shared.tasks import Access

# Groups per page when each embeds its samples' trajectories and evaluations.
MAX_RESULTS_PAGE = 16

router = APIRouter(prefix="/v1/batches", tags=["batches"], dependencies=[Depends(require_auth)])

# The body is parsed by hand (to answer 400 on malformed JSON); its schema for /docs. Its nested
# models (SamplingParams, Limits) are the job request's, which api/openapi.py puts in components.
_BODY_SCHEMA = BatchRequest.model_json_schema(ref_template="#/components/schemas/{model}")
_BODY_SCHEMA.pop("$defs", None)
_CURSOR = Query(
    default="0-0", pattern=r"^\d+-\d+$", description="Return groups after this cursor (from the last reply)."
)
SSE_BLOCK_S = 15.0  # a keep-alive comment at least this often, which is also how fast a gone client is noticed


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Create a batch: a list of prompts, n samples per prompt, a target (every prompt, or DAPO)",
    responses={
        400: {"description": "Malformed JSON"},
        403: {
            "model": Refusal,
            "description": "prompts_path or execution settings from a caller without the admin scope",
        },
        422: {"description": "Invalid batch or prompts: each problem naming its field (`body.prompts[3].task.kind`)"},
        503: {"description": "No room for new jobs: Redis above its high-water mark, or the results store unhealthy"},
    },
    dependencies=[Depends(require_room)],
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _BODY_SCHEMA}}}},
)
async def create_batch(
    request: Request, batches: BatchStore = Depends(get_batches), access: Access = Depends(submitter_access)
) -> Response:
    """Checks every prompt first; launches the first groups and answers with the batch at once."""
    settings = request.app.state.settings
    body = load_json_body(await request.body(), settings.max_json_depth)
    if not isinstance(body, dict):
        raise ValidationError("expected a batch object", ("body",))
    try:
        batch = BatchRequest.model_validate(body)
    except PydanticValidationError as exc:
        raise ValidationError.from_pydantic(exc, ("body",)) from None
    if batch.prompts_path is not None and not access.admin:
        raise NotPermitted(
            "a file on the server: only an admin names one; send the prompts instead", ("body", "prompts_path")
        )
    prompts = await run_in_threadpool(
        load_prompts, batch, settings.prompt_files_root, settings.prompt_file_max_bytes, access
    )
    if batch.min_informative_groups is not None and batch.min_informative_groups > len(prompts):
        message = f"{batch.min_informative_groups} groups asked for, but the batch has {len(prompts)} prompts"
        raise ValidationError(message, ("body", "min_informative_groups"))
    batch_id = await run_in_threadpool(start_batch, batches, batch, prompts)
    head = await run_in_threadpool(batches.head, batch_id)
    return respond(request, batch_view(head), status_code=status.HTTP_202_ACCEPTED)


@router.get("/{batch_id}", summary="A batch's status and counts (launched, in flight, filtered, used)")
def get_batch(batch_id: str, request: Request, batches: BatchStore = Depends(get_batches)) -> Response:
    return respond(request, batch_view(_head(batches, batch_id)))


@router.get(
    "/{batch_id}/groups",
    summary="Completed groups after a cursor; waits up to `wait` seconds for the next one (long-poll)",
)
async def list_groups(
    batch_id: str,
    request: Request,
    after: str = _CURSOR,
    wait: float = Query(default=20.0, ge=0.0, le=60.0, description="Seconds to wait when nothing is new."),
    limit: int = Query(default=100, ge=1, le=1000),
    results: bool = Query(default=False, description="Embed each sample's trajectory and evaluation."),
    batches: BatchStore = Depends(get_batches),
    stream: GroupStream = Depends(get_group_stream),
) -> Response:
    """`done` is true once the batch has closed and every group it reported has been returned.

    With `results`, a page holds at most MAX_RESULTS_PAGE groups (each embeds n trajectories)."""
    if results:
        limit = min(limit, MAX_RESULTS_PAGE)
    await run_in_threadpool(_head, batches, batch_id)
    deadline = time.monotonic() + wait
    page: list[tuple[str, int]] = []
    cursor, ended = after, False
    while True:
        block = max(0.0, deadline - time.monotonic())
        read = await stream.read(batch_id, cursor, limit - len(page), block)
        page.extend(read.entries)
        cursor, ended = read.cursor, read.ended
        if page or ended or time.monotonic() >= deadline or await request.is_disconnected():
            break
    views = await run_in_threadpool(group_views, batches, batch_id, [k for _, k in page], results)
    for (entry_id, _), view in zip(page, views):
        view["cursor"] = entry_id
    head = await run_in_threadpool(_head, batches, batch_id)
    return respond(request, {"batch": batch_view(head), "groups": views, "cursor": cursor, "done": ended})


@router.get(
    "/{batch_id}/events",
    summary="Completed groups as server-sent events (`group`, then one `end`); resumable with Last-Event-ID",
    response_class=StreamingResponse,
)
async def stream_events(
    batch_id: str,
    request: Request,
    after: str = _CURSOR,
    results: bool = Query(default=False, description="Embed each sample's trajectory and evaluation."),
    last_event_id: str | None = Header(default=None, pattern=r"^\d+-\d+$"),
    batches: BatchStore = Depends(get_batches),
    stream: GroupStream = Depends(get_group_stream),
) -> StreamingResponse:
    await run_in_threadpool(_head, batches, batch_id)
    start = last_event_id or after

    async def events() -> AsyncIterator[bytes]:
        cursor = start
        while not await request.is_disconnected():
            read = await stream.read(batch_id, cursor, 100, SSE_BLOCK_S)
            cursor = read.cursor
            views = await run_in_threadpool(group_views, batches, batch_id, [k for _, k in read.entries], results)
            for (entry_id, _), view in zip(read.entries, views):
                view["cursor"] = entry_id
                yield _sse("group", view, entry_id)
            if read.ended:
                head = await run_in_threadpool(_head, batches, batch_id)
                yield _sse("end", batch_view(head), cursor)
                return
            if not read.entries:
                yield b": keep-alive\n\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


@router.delete(
    "/{batch_id}",
    summary="Cancel a batch: no new groups, running ones cancelled",
    responses={404: {"description": "No such batch"}, 409: {"description": "Already finished"}},
    dependencies=[Depends(require_admin)],  # cancelling is admin scope, as for jobs
)
def cancel_batch(batch_id: str, request: Request, batches: BatchStore = Depends(get_batches)) -> Response:
    closed, previous = batches.close(batch_id)
    if not closed:
        if not previous:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no batch with id {batch_id!r}")
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"batch {batch_id} is already {previous}")
    cancel_groups(batches, batch_id, batches.in_flight_groups(batch_id))
    return respond(request, batch_view(_head(batches, batch_id)))


def _head(batches: BatchStore, batch_id: str) -> dict[str, Any]:
    head = batches.head(batch_id)
    if head is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no batch with id {batch_id!r}")
    return head


def _sse(event: str, data: dict[str, Any], event_id: str) -> bytes:
    return b"id: " + event_id.encode() + b"\nevent: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
