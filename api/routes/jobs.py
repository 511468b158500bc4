"""Submit, read, list and cancel jobs."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api.admission import require_room
from api.deps import require_admin, require_auth, submitter_access
from api.errors import Refusal, validation_response
from api.job_end_waits import JobEndWaits
from api.job_events import listener
from api.json_body import load_json_body
from api.negotiation import respond
from api.routes import external_agent
from api.schemas import Cancelled, JobList, JobSummary, JobView, Submitted
from shared.config import STAGES
from shared.errors import ValidationError
from shared.job_end import job_ended
from shared.jobs.backend_wait import WAITING_DETAIL, is_waiting
from shared.jobs.record_fields import attempts_field, output_field, wait_field
from shared.jobs.status import ALL_STATUSES, TERMINAL, JobStatus
from shared.jobs.store import IdempotencyConflict, JobStore, reward_of
from shared.tasks import Access, validate_job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(require_auth)])


def get_store(request: Request) -> JobStore:
    return request.app.state.store


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=Submitted,
    summary="Submit one job or a list of jobs",
    responses={
        400: {"description": "Malformed JSON"},
        403: {
            "model": Refusal,
            "description": "Execution settings (task.sandbox network, limits, env, image; server "
            "paths) from a caller without the admin scope: name an operator's task profile instead",
        },
        409: {"model": Refusal, "description": "An idempotency key already held by a different job"},
        413: {"description": "Body or list too large"},
        422: {"description": "Invalid jobs: every problem of each, naming its field (`body[3].task.kind`)"},
        503: {"description": "No room for new jobs: Redis above its high-water mark, or the results store unhealthy"},
    },
    dependencies=[Depends(require_room)],
)
async def submit_jobs(
    request: Request,
    store: JobStore = Depends(get_store),
    access: Access = Depends(submitter_access),
    idempotency_key: str | None = Header(
        default=None,
        min_length=1,
        max_length=200,
        description="A retry-safe submission: the key of a single job, "
        "or `<key>/<index>` of each job of a list, for jobs that name no `idempotency_key` of their own.",
    ),
) -> Any:
    """Validates every job first; nothing is stored unless all are valid. Answers at once with the ids."""
    body = load_json_body(await request.body(), request.app.state.settings.max_json_depth)
    if idempotency_key is not None:
        body = with_request_key(body, idempotency_key)
    items = body if isinstance(body, list) else [body]
    if not isinstance(body, (list, dict)):
        raise ValidationError("expected a job object or a list of jobs", ("body",))
    if not items:
        raise ValidationError("the list of jobs is empty", ("body",))
    limit = request.app.state.settings.max_jobs_per_request
    if len(items) > limit:
        return validation_response(
            [{"field": "body", "message": f"{len(items)} jobs in one request; the limit is {limit}"}], status_code=413
        )
    many = isinstance(body, list)
    specs = _validate(items, many, access)
    try:
        submitted = await run_in_threadpool(store.submit, specs)
    except IdempotencyConflict as exc:
        raise (
            exc.within("body") if many else IdempotencyConflict(exc.key, exc.job_id, ("body", "idempotency_key"))
        ) from None
    # Built by hand (the shape is `Submitted`): this is the hot path a trainer hits per job.
    payload = {"job_ids": [s.job_id for s in submitted], "created": [s.created for s in submitted]}
    if any(spec.get("agent") == "external" for spec in specs):
        secret = await run_in_threadpool(external_agent.secret_of, request)
        payload["agent"] = [
            external_agent.endpoint(request, s.job_id, secret) if spec.get("agent") == "external" else None
            for s, spec in zip(submitted, specs, strict=True)
        ]
    return respond(request, payload, status_code=status.HTTP_202_ACCEPTED)


def with_request_key(body: Any, key: str) -> Any:
    """The Idempotency-Key header as the jobs' own keys, where they have none."""
    if isinstance(body, dict):
        return {"idempotency_key": key, **body}
    if isinstance(body, list):
        return [
            {"idempotency_key": f"{key}/{i}", **job} if isinstance(job, dict) else job for i, job in enumerate(body)
        ]
    return body


def _validate(items: list[Any], many: bool, access: Access) -> list[dict[str, Any]]:
    """The jobs as stored, or one ValidationError naming every problem of every job (`body[i]...`)."""
    specs: list[dict[str, Any]] = []
    problems: list[ValidationError] = []
    for index, item in enumerate(items):
        try:
            job = validate_job(item, ("body", index) if many else ("body",), access)
        except ValidationError as exc:
            problems.append(exc)
            continue
        specs.append(job.model_dump(mode="json"))
    if problems:
        raise ValidationError.combine(problems)
    return specs


@router.get(
    "/{job_id}",
    response_model=JobView,
    summary="A job's status, timings and, when done, its result",
    responses={
        404: {"description": "No such job"},
        410: {"description": "The job's stored result is gone (expired or removed); names the job and the file"},
        500: {"description": "The job's stored result is corrupt; names the job and the file"},
    },
)
def get_job(job_id: str, request: Request, store: JobStore = Depends(get_store)) -> Response:
    record = store.get(job_id)
    if record is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with id {job_id!r}")
    view = job_view(store.with_outputs(record))
    if (record.get("spec") or {}).get("agent") == "external":
        view["agent"] = external_agent.endpoint(request, job_id, external_agent.secret_of(request))
    return respond(request, view)


def job_view(record: dict[str, Any]) -> dict[str, Any]:
    """The public shape of a record: internal stage outputs become `result` once the job is done."""
    spec = record.get("spec") or {}
    view: dict[str, Any] = {
        "id": record["id"],
        "status": record["status"],
        "kind": record.get("kind", ""),
        "group_id": record.get("group_id"),
        "sample_index": record.get("sample_index"),
        "created_at": record["created_at"],
        "updated_at": record["updated_at"],
        "finished_at": record.get("finished_at"),
        "status_detail": WAITING_DETAIL if is_waiting(record) else None,
        "timings": record["timings"],
        "attempts": record["attempts"],
        "workers": record["workers"],
        "lost": record["lost"],
        "failovers": record["failovers"],
        "result": None,
        "error": record.get("error"),
        "partial": record.get("partial"),
        "request": spec,
    }
    if record["status"] == JobStatus.DONE:
        evaluation = record.get(output_field("eval")) or {}
        view["result"] = {
            "reward": evaluation.get("reward"),
            "trajectory": record.get(output_field("rollout")) or {},
            "evaluation": evaluation,
        }
    elif record["status"] in TERMINAL:
        view["partial"] = _with_finished_rollout(view["partial"], record.get(output_field("rollout")))
    return view


def _with_finished_rollout(partial: dict[str, Any] | None, rollout: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job stopped after its rollout (eval failed or timed out) still has the trajectory the rollout
    finished: it is the record up to where the job stopped, so it is served as `partial.trajectory`."""
    if not rollout or (partial and "trajectory" in partial):
        return partial
    return {**(partial or {}), "trajectory": rollout}


# Past any real job count, and inside the 64-bit range Redis takes for an index.
MAX_OFFSET = 10**9

_SUMMARY_FIELDS = (
    "id",
    "status",
    "kind",
    "group_id",
    "sample_index",
    "created_at",
    "updated_at",
    "finished_at",
    "reward",
    output_field("eval"),
    *(field(stage) for stage in STAGES for field in (wait_field, attempts_field)),  # for status_detail
)


MAX_WAIT_S = 60.0


@router.get("", response_model=JobList, summary="List jobs, newest first, by status or GRPO group")
async def list_jobs(
    request: Request,
    status_filter: str | None = Query(default=None, alias="status", description="One of the job statuses."),
    group_id: str | None = Query(default=None, max_length=128),
    ids: str | None = Query(default=None, description="Comma-separated job ids: fetch exactly these (for polling)."),
    wait_s: float = Query(
        default=0.0,
        ge=0,
        le=MAX_WAIT_S,
        description="With `ids`: answer once any of them has ended, or after this many seconds (a long poll: "
        "a job's end is pushed to the waiting request, no polling needed).",
    ),
    limit: int = Query(default=100, ge=1),
    offset: int = Query(default=0, ge=0, le=MAX_OFFSET, description="Jobs to skip (at most 10**9)."),
    cursor: str | None = Query(
        default=None,
        max_length=200,
        description="The `next_cursor` of the page before: pages that stay put while "
        "jobs are submitted (instead of `offset`).",
    ),
    store: JobStore = Depends(get_store),
) -> Response:
    if status_filter is not None and status_filter not in ALL_STATUSES:
        known = ", ".join(ALL_STATUSES)
        raise ValidationError(f"unknown status {status_filter!r}; one of {known}", ("query", "status"))
    page_max = request.app.state.settings.list_page_max
    if limit > page_max:
        raise ValidationError(f"at most {page_max}", ("query", "limit"))
    if wait_s and ids is None:
        raise ValidationError("a long poll waits for given jobs: give ids too", ("query", "wait_s"))
    if ids is not None:
        wanted = [i for i in ids.split(",") if i]
        if wait_s and not wanted:
            raise ValidationError("a long poll needs at least one job id", ("query", "ids"))
        if len(wanted) > page_max:
            raise ValidationError(f"at most {page_max} per request", ("query", "ids"))
        jobs = await _summaries_once_one_ends(request, store, wanted, wait_s)
        return respond(request, {"jobs": jobs, "limit": limit, "offset": offset, "next_cursor": None})
    if cursor is not None and offset:
        raise ValidationError("give cursor or offset, not both", ("query", "offset"))
    job_ids, next_cursor = await run_in_threadpool(
        store.list_page, status_filter, group_id, limit, offset=offset, after=cursor
    )
    jobs = await run_in_threadpool(_summaries, store, job_ids)
    return respond(request, {"jobs": jobs, "limit": limit, "offset": offset, "next_cursor": next_cursor})


async def _summaries_once_one_ends(
    request: Request, store: JobStore, job_ids: list[str], wait_s: float
) -> list[dict[str, Any]]:
    """The jobs' summaries, at once if any has ended (or gone) or no wait was asked, else once one ends or
    `wait_s` has passed. Registered before the first read, so an end between read and wait still wakes it."""
    jobs = await run_in_threadpool(_summaries, store, job_ids)
    if not wait_s or _any_ended(jobs, job_ids):
        return jobs
    deadline = time.monotonic() + wait_s
    waits = _job_end_waits(request)
    with waits.watching(job_ids) as ended:
        while (left := deadline - time.monotonic()) > 0:
            ended.clear()  # before the read: an end published during it still wakes the wait
            jobs = await run_in_threadpool(_summaries, store, job_ids)
            if _any_ended(jobs, job_ids):
                break
            await waits.wait(ended, left)
    return await run_in_threadpool(_summaries, store, job_ids) if left <= 0 else jobs


def _any_ended(jobs: list[dict[str, Any]], job_ids: list[str]) -> bool:
    """Some job has ended, or is gone (expired, or never there): a waiting client must hear of it now."""
    return len(jobs) < len(job_ids) or any(job["status"] in TERMINAL for job in jobs)


def _job_end_waits(request: Request) -> JobEndWaits:
    """This process's long polls, listening to the jobs' events (subscribed on first use)."""
    return listener(request, "job_end_waits", JobEndWaits)


def _summaries(store: JobStore, job_ids: list[str]) -> list[dict[str, Any]]:
    """One pipelined read; a job that is gone (never there, or expired) is left out."""
    with store.redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(store.keys.job(job_id), _SUMMARY_FIELDS)
        rows = pipe.execute()
    return [_summary(row) for row in rows if row[0] is not None]


def _summary_waiting(values: dict[str, bytes | None], status: str) -> bool:
    """`is_waiting` on the summary's few fields."""
    if status not in STAGES:
        return False
    waited = values[wait_field(status)]
    return waited is not None and waited == values[attempts_field(status)]


def _summary(row: list[bytes | None]) -> dict[str, Any]:
    values = dict(zip(_SUMMARY_FIELDS, row))

    def text(name: str) -> str | None:
        value = values[name]
        return value.decode() if value is not None else None

    def number(name: str) -> float | None:
        value = values[name]
        return float(value) if value is not None else None

    return JobSummary(
        id=text("id") or "",
        status=text("status") or "",
        kind=text("kind") or "",
        group_id=text("group_id"),
        sample_index=int(values["sample_index"]) if values["sample_index"] is not None else None,
        created_at=number("created_at") or 0.0,
        updated_at=number("updated_at") or 0.0,
        finished_at=number("finished_at"),
        status_detail=WAITING_DETAIL if _summary_waiting(values, text("status") or "") else None,
        reward=reward_of(values["reward"], values[output_field("eval")]) if text("status") == JobStatus.DONE else None,
    ).model_dump()


@router.delete(
    "/{job_id}",
    response_model=Cancelled,
    summary="Cancel a job",
    responses={
        403: {"description": "Not an admin token"},
        404: {"description": "No such job"},
        409: {"description": "Already finished"},
    },
    dependencies=[Depends(require_admin)],
)
def cancel_job(job_id: str, store: JobStore = Depends(get_store)) -> JSONResponse:
    """A queued job never runs; a running one is stopped by its worker, which also removes its sandbox and state."""
    moved = store.cancel(job_id)
    if not moved.applied:
        if not moved.previous:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with id {job_id!r}")
        assert moved.previous in TERMINAL
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"job {job_id} is already {moved.previous}")
    # What the API can do itself: the pin goes, the batch group records the job. The workspace and
    # the sandbox are the workers': the job's worker removes them when it sees the cancel.
    job_ended(store, job_id)
    return JSONResponse({"id": job_id, "status": JobStatus.CANCELLED, "previous": moved.previous})
