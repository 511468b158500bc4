"""Submit, read, list and cancel jobs: the HTTP side; the views are shared/jobs/views.py, storing submission.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api.deps import get_store, require_admin, require_auth, require_room, submitter_access
from api.errors import Refusal, validation_response
from api.external_agent.endpoint import endpoint, secret_of
from api.jobs.long_poll import summaries_once_one_ends
from api.jobs.schemas import Cancelled, JobList, JobView, Submitted
from api.json_body import load_json_body
from api.negotiation import respond
from shared.errors import ValidationError
from shared.job_end import job_ended
from shared.jobs import submission
from shared.jobs.status import ALL_STATUSES, TERMINAL, JobStatus
from shared.jobs.store import JobStore
from shared.jobs.views import job_summaries, job_view
from shared.tasks import Access, validate_job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(require_auth)])

# Past any real job count, and inside the 64-bit range Redis takes for an index.
MAX_OFFSET = 10**9
MAX_WAIT_S = 60.0
_NOT_FOUND = {404: {"description": "No such job"}}


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
        body = submission.with_request_key(body, idempotency_key)
    items, many = submission.job_items(body), isinstance(body, list)
    limit = request.app.state.settings.max_jobs_per_request
    if len(items) > limit:
        return validation_response(
            [{"field": "body", "message": f"{len(items)} jobs in one request; the limit is {limit}"}], status_code=413
        )
    specs = _validate(items, many, access)
    submitted = await run_in_threadpool(submission.submit_jobs, store, specs, many)
    # Built by hand (the shape is `Submitted`): this is the hot path a trainer hits per job.
    payload = {"job_ids": [s.job_id for s in submitted], "created": [s.created for s in submitted]}
    if any(spec.get("agent") == "external" for spec in specs):
        secret = await run_in_threadpool(secret_of, request)
        payload["agent"] = [
            endpoint(request, s.job_id, secret) if spec.get("agent") == "external" else None
            for s, spec in zip(submitted, specs, strict=True)
        ]
    return respond(request, payload, status_code=status.HTTP_202_ACCEPTED)


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
        **_NOT_FOUND,
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
        view["agent"] = endpoint(request, job_id, secret_of(request))
    return respond(request, view)


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
        jobs = await summaries_once_one_ends(request, store, wanted, wait_s)
        return respond(request, {"jobs": jobs, "limit": limit, "offset": offset, "next_cursor": None})
    if cursor is not None and offset:
        raise ValidationError("give cursor or offset, not both", ("query", "offset"))
    job_ids, next_cursor = await run_in_threadpool(
        store.list_page, status_filter, group_id, limit, offset=offset, after=cursor
    )
    jobs = await run_in_threadpool(job_summaries, store, job_ids)
    return respond(request, {"jobs": jobs, "limit": limit, "offset": offset, "next_cursor": next_cursor})


@router.delete(
    "/{job_id}",
    response_model=Cancelled,
    summary="Cancel a job",
    responses={403: {"description": "Not an admin token"}, **_NOT_FOUND, 409: {"description": "Already finished"}},
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
