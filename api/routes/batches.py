"""Batches: create (GRPO groups, DAPO dynamic sampling), read, stream completed groups, cancel.

The two streaming endpoints are async and wait on the batch's Redis Stream with
redis.asyncio (XREAD BLOCK), so a waiting trainer holds no threadpool thread;
building the group views (a few Redis reads) runs in the threadpool.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, status
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError as PydanticValidationError
from redis.asyncio import Redis as AsyncRedis
from starlette.concurrency import run_in_threadpool

from api.admission import require_room
from api.deps import require_admin, require_auth, submitter_access
from api.errors import Refusal
from api.json_body import load_json_body
from api.negotiation import respond
from shared.batches.prompts import load_prompts
from shared.batches.replenish import batch_store, cancel_groups, start_batch
from shared.batches.spec import BatchRequest
from shared.batches.status import BatchStatus
from shared.batches.store import BatchStore, group_views
from shared.batches.views import batch_view
from shared.errors import NotPermitted, ValidationError
from shared.redis_conn import MAX_CONNECTIONS
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

_RUNNING = BatchStatus.RUNNING.value.encode()  # as the async client reads the status field: bytes


def get_batches(request: Request) -> BatchStore:
    return batch_store(request.app.state.store)


def get_async_redis(request: Request) -> AsyncRedis:
    """One redis.asyncio client per app, made on first use (the app's own client is synchronous)."""
    client = getattr(request.app.state, "batches_async_redis", None)
    if client is None:
        # Reads block for up to a long-poll's wait (at most 60 s): the socket timeout must outlast that.
        # Every waiting long-poll holds a connection: redis-py 8's default cap of 100 would fail the 101st.
        client = AsyncRedis.from_url(
            request.app.state.settings.redis_url,
            health_check_interval=30,
            socket_timeout=90,
            max_connections=MAX_CONNECTIONS,
        )
        request.app.state.batches_async_redis = client
    return client


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
    aredis: AsyncRedis = Depends(get_async_redis),
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
        entries, cursor, ended = await _read(aredis, batches, batch_id, cursor, limit - len(page), block)
        page.extend(entries)
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
    aredis: AsyncRedis = Depends(get_async_redis),
) -> StreamingResponse:
    await run_in_threadpool(_head, batches, batch_id)
    start = last_event_id or after

    async def events() -> AsyncIterator[bytes]:
        cursor = start
        while not await request.is_disconnected():
            entries, cursor, ended = await _read(aredis, batches, batch_id, cursor, 100, SSE_BLOCK_S)
            views = await run_in_threadpool(group_views, batches, batch_id, [k for _, k in entries], results)
            for (entry_id, _), view in zip(entries, views):
                view["cursor"] = entry_id
                yield _sse("group", view, entry_id)
            if ended:
                head = await run_in_threadpool(_head, batches, batch_id)
                yield _sse("end", batch_view(head), cursor)
                return
            if not entries:
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


async def _read(
    aredis: AsyncRedis, batches: BatchStore, batch_id: str, cursor: str, count: int, block_s: float
) -> tuple[list[tuple[str, int]], str, bool]:
    """([(entry id, prompt index)], new cursor, ended) from the stream after `cursor`, waiting up to block_s."""
    stream, key, count = batches.keys.stream(batch_id), batches.keys.batch(batch_id), max(1, count)
    if await aredis.hget(key, "status") == _RUNNING:
        block_ms = int(block_s * 1000)
        reply = await aredis.xread({stream: cursor}, count=count, block=block_ms if block_ms > 0 else None)
        if not reply and await aredis.hget(key, "status") == _RUNNING:
            return [], cursor, False
    else:
        reply = None
    if not reply:
        # Closed. A batch closes and writes its `end` entry in one script, so one more read
        # decides: entries still after the cursor are returned, else the end was already read.
        reply = await aredis.xread({stream: cursor}, count=count)
        if not reply:
            return [], cursor, True
    entries: list[tuple[str, int]] = []
    for _, items in reply:
        for entry_id_raw, fields in items:
            cursor = entry_id_raw.decode()
            kind = fields.get(b"type")
            if kind == b"group":
                entries.append((cursor, int(fields[b"k"])))
            elif kind == b"end":
                return entries, cursor, True
    return entries, cursor, False


def _sse(event: str, data: dict[str, Any], event_id: str) -> bytes:
    return b"id: " + event_id.encode() + b"\nevent: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
