"""Every API call, defined once: the request it sends, how it reads the answer, its errors and retries.

Each call is a generator of steps (steps.py) that does no I/O. RolloutClient (sync.py) and
AsyncRolloutClient (aio.py) each write every public method out as a line that runs the call of
its name here, where the method's docstring says what it does for a user; these say how.
`client` is the client the method was called on.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from rollouts_client.errors import ApiError, BatchExhausted, WaitTimeout
from rollouts_client.models import Batch, BatchStatus, Group, GroupPage, Job, JobsProgress
from rollouts_client.steps import (
    Call,
    CallingClient,
    CloseStream,
    Emit,
    Gather,
    NextLine,
    OpenStream,
    Send,
    Sleep,
    Stream,
    collect,
)
from rollouts_client.wire import (
    RESULTS_PAGE_GROUPS,
    RetryPolicy,
    SseParser,
    StreamUnavailable,
    backend_body,
    batch_body,
    decode,
    list_params,
    weights_body,
    weights_path,
    weights_upload,
)

LIST_CHUNK = 500  # job ids per GET /v1/jobs?ids=... (job_summaries)
MAX_WAIT_S = 60.0  # the longest long poll the service takes (GET /v1/jobs?ids=...&wait_s=)
JOBS_LONG_POLL_S = MAX_WAIT_S / 2  # how long one watch_jobs request waits for an end, by default
LONG_POLL_S = 20.0  # how long one groups() request waits for a group
STREAM_READ_S = 60.0  # the longest quiet on an event stream before it counts as dropped


def request(client: CallingClient, method: str, path: str, **kwargs: Any) -> Call[httpx.Response]:
    """The retry loop of every call: one Send per try, a Sleep between tries, as RetryPolicy says."""
    delays = iter(client.retry.delays())
    has_key = "Idempotency-Key" in (kwargs.get("headers") or {})
    while True:
        error: Exception | None = None
        response: httpx.Response | None = None
        try:
            response = yield Send(method, path, kwargs)
        except httpx.TransportError as exc:
            error = exc
        delay = next(delays, None) if client.retry.retryable(method, error, response, has_key) else None
        if delay is None:
            if error is not None:
                raise error
            assert response is not None
            return response
        yield Sleep(delay)


# --- jobs -------------------------------------------------------------------------------------
def submit_jobs(
    client: CallingClient, jobs: list[dict[str, Any]] | dict[str, Any], *, idempotency_key: str | None = None
) -> Call[list[str]]:
    """POST /v1/jobs (one job or a list), under an Idempotency-Key header when given."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    response = yield from request(client, "POST", "/v1/jobs", json=jobs, headers=headers)
    return decode(response, (202,))["job_ids"]


def get_job(client: CallingClient, job_id: str) -> Call[Job]:
    """GET /v1/jobs/{id}."""
    return Job.from_api(decode((yield from request(client, "GET", f"/v1/jobs/{job_id}"))))


def job_summaries(client: CallingClient, job_ids: list[str], wait_s: float = 0.0) -> Call[list[Job]]:
    """GET /v1/jobs?ids=..., LIST_CHUNK ids a request; with `wait_s`, a long poll (one request)."""
    if wait_s and len(job_ids) > LIST_CHUNK:
        raise ValueError(f"a long poll takes at most {LIST_CHUNK} job ids, not {len(job_ids)}")
    out: list[Job] = []
    for start in range(0, len(job_ids), LIST_CHUNK):
        chunk = job_ids[start : start + LIST_CHUNK]
        params: dict[str, Any] = {"ids": ",".join(chunk), "limit": len(chunk)}
        options: dict[str, Any] = {}
        if wait_s:
            params["wait_s"] = min(wait_s, MAX_WAIT_S)
            options["timeout"] = params["wait_s"] + 30  # the answer may take the whole wait
        page = decode((yield from request(client, "GET", "/v1/jobs", params=params, **options)))
        out.extend(Job.from_api(j) for j in page["jobs"])
    return out


def list_jobs(
    client: CallingClient, *, status: str | None = None, group_id: str | None = None, limit: int = 100, offset: int = 0
) -> Call[list[Job]]:
    """GET /v1/jobs, one page by offset."""
    params = list_params(status, group_id, limit, offset)
    return [Job.from_api(j) for j in decode((yield from request(client, "GET", "/v1/jobs", params=params)))["jobs"]]


def iter_jobs(
    client: CallingClient, *, status: str | None = None, group_id: str | None = None, page_size: int = 500
) -> Stream[Job]:
    """GET /v1/jobs page after page, each after the last one's `next_cursor`."""
    cursor: str | None = None
    while True:
        params = list_params(status, group_id, page_size, cursor=cursor)
        page = decode((yield from request(client, "GET", "/v1/jobs", params=params)))
        for job in page["jobs"]:
            yield Emit(Job.from_api(job))
        cursor = page.get("next_cursor")
        if not cursor:
            return


def watch_jobs(
    client: CallingClient,
    job_ids: list[str],
    timeout: float | None = None,
    poll_s: float = 0.5,
    *,
    max_poll_s: float | None = None,
    update_s: float = JOBS_LONG_POLL_S,
) -> Stream[JobsProgress]:
    """The one way to wait for jobs. A long poll of every pending job (LIST_CHUNK at most) that the
    service answers once one ends, or after `update_s`; each answer is emitted as JobsProgress. More
    jobs (no long poll), or a service that answers at once with nothing ended (no push), are asked
    again after `poll_s`, doubling to `max_poll_s` while nothing ends: polled, never spun."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(dict.fromkeys(job_ids))
    interval, longest = poll_s, poll_s if max_poll_s is None else max_poll_s
    while pending:
        left = update_s if deadline is None else max(0.0, deadline - time.monotonic())
        wait_s = min(update_s, left) if len(pending) <= LIST_CHUNK else 0.0
        asked = time.monotonic()
        progress = JobsProgress.of(pending, (yield from job_summaries(client, pending, wait_s)))
        pending = [job.id for job in progress.running]
        yield Emit(progress)
        if not pending:
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"{len(pending)} of {len(job_ids)} jobs still running after {timeout}s")
        interval = poll_s if progress.moved else min(interval * 2, longest)
        if (not wait_s or not progress.moved) and time.monotonic() - asked < interval:  # polled: don't spin
            yield Sleep(interval)


def wait_jobs(
    client: CallingClient, job_ids: list[str], timeout: float | None = None, poll_s: float = 0.5
) -> Call[list[Job]]:
    """watch_jobs to the end, then every full record (read concurrently where the driver can)."""
    yield from collect(watch_jobs(client, job_ids, timeout, poll_s), keep=False)
    return (yield Gather([get_job(client, job_id) for job_id in job_ids]))


def cancel_job(client: CallingClient, job_id: str) -> Call[bool]:
    """DELETE /v1/jobs/{id}; a 409 means it had already finished."""
    response = yield from request(client, "DELETE", f"/v1/jobs/{job_id}")
    if response.status_code == 409:
        return False
    decode(response)
    return True


# --- batches ----------------------------------------------------------------------------------
def submit_batch(
    client: CallingClient,
    prompts: list[dict[str, Any]] | None = None,
    *,
    prompts_path: str | None = None,
    n_samples: int = 8,
    min_informative_groups: int | None = None,
    **options: Any,
) -> Call[Batch]:
    """POST /v1/batches."""
    body = batch_body(prompts, prompts_path, n_samples, min_informative_groups, options)
    return Batch.from_api(decode((yield from request(client, "POST", "/v1/batches", json=body)), (202,)))


def get_batch(client: CallingClient, batch_id: str) -> Call[Batch]:
    """GET /v1/batches/{id}."""
    return Batch.from_api(decode((yield from request(client, "GET", f"/v1/batches/{batch_id}"))))


def cancel_batch(client: CallingClient, batch_id: str) -> Call[Batch | None]:
    """DELETE /v1/batches/{id}; a 409 means it had already finished."""
    response = yield from request(client, "DELETE", f"/v1/batches/{batch_id}")
    if response.status_code == 409:
        return None
    return Batch.from_api(decode(response))


def groups(
    client: CallingClient,
    batch_id: str,
    after: str = "0-0",
    wait: float = LONG_POLL_S,
    results: bool = False,
    limit: int | None = None,
) -> Call[GroupPage]:
    """GET /v1/batches/{id}/groups, one long poll (its read timeout outlasts the wait)."""
    params: dict[str, Any] = {"after": after, "wait": wait, "results": str(results).lower()}
    if limit is not None:
        params["limit"] = limit
    path = f"/v1/batches/{batch_id}/groups"
    return GroupPage.from_api(decode((yield from request(client, "GET", path, params=params, timeout=wait + 30))))


def iter_groups(
    client: CallingClient,
    batch_id: str,
    *,
    results: bool = True,
    timeout: float | None = None,
    after: str = "0-0",
    partial: bool = False,
) -> Stream[Group]:
    """groups() after groups(), each from the last page's cursor, until the batch's stream is done."""
    deadline = None if timeout is None else time.monotonic() + timeout
    cursor, received = after, 0
    while True:
        wait = LONG_POLL_S if deadline is None else max(0.0, min(LONG_POLL_S, deadline - time.monotonic()))
        page = yield from groups(client, batch_id, cursor, wait, results, RESULTS_PAGE_GROUPS if results else None)
        for group in page.groups:
            received += 1
            yield Emit(group)
        cursor = page.cursor
        if page.done:
            _ended(page.batch, received, partial)
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"batch {batch_id} still running after {timeout}s")


def _ended(batch: Batch, received: int, partial: bool) -> None:
    """The end of a batch's stream: BatchExhausted for a batch that could not fill, unless `partial`."""
    if batch.status == BatchStatus.EXHAUSTED and not partial:
        raise BatchExhausted(batch, received)


def iter_events(
    client: CallingClient, batch_id: str, *, results: bool = False, timeout: float | None = None, partial: bool = False
) -> Stream[Group]:
    """GET /v1/batches/{id}/events as server-sent events; a drop reconnects after the last event id, with backoff."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last_id, received = "0-0", 0
    delays = iter(client.retry.delays())
    while True:
        try:
            response = yield OpenStream(
                "GET",
                f"/v1/batches/{batch_id}/events",
                {
                    "params": {"results": str(results).lower()},
                    "headers": {"Accept": "text/event-stream", "Last-Event-ID": last_id},
                    "timeout": httpx.Timeout(client.http.timeout.connect, read=STREAM_READ_S),
                },
            )
            if response.status_code != 200:
                if RetryPolicy.retryable("GET", None, response):
                    raise StreamUnavailable(response)
                decode(response)
            delays = iter(client.retry.delays())  # connected: the next drop starts the backoff afresh
            parser = SseParser()
            while (line := (yield NextLine())) is not None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"batch {batch_id} still running after {timeout}s")
                event = parser.feed(line)
                if event is None:
                    continue
                name, event_id, data = event
                if name == "end":  # its data is the batch
                    if data.get("status") == BatchStatus.EXHAUSTED:
                        _ended(Batch.from_api(data), received, partial)
                    return
                last_id = event_id or last_id
                received += 1
                yield Emit(Group.from_api(data))
        except (httpx.TransportError, StreamUnavailable) as exc:
            yield CloseStream()
            delay = next(delays, None)
            if delay is None:
                if isinstance(exc, StreamUnavailable):
                    raise exc.error from None
                raise
            yield Sleep(delay)


def wait_batch(client: CallingClient, batch_id: str, timeout: float | None = None) -> Call[Batch]:
    """iter_groups to the end, keeping nothing, then the batch."""
    yield from collect(iter_groups(client, batch_id, results=False, timeout=timeout, partial=True), keep=False)
    final = yield from get_batch(client, batch_id)
    if final.status == BatchStatus.EXHAUSTED:
        raise BatchExhausted(final)
    return final


def collect_groups(
    client: CallingClient, batch_id: str, *, results: bool = True, timeout: float | None = None, partial: bool = False
) -> Call[list[Group]]:
    """iter_groups, collected."""
    return (yield from collect(iter_groups(client, batch_id, results=results, timeout=timeout, partial=partial)))


# --- the service ------------------------------------------------------------------------------
def health(client: CallingClient) -> Call[bool]:
    """GET /healthz, one try: a transport error is an answer (False)."""
    try:
        return (yield Send("GET", "/healthz")).status_code == 200
    except httpx.TransportError:
        return False


def status(client: CallingClient) -> Call[dict[str, Any]]:
    """GET /v1/status."""
    return decode((yield from request(client, "GET", "/v1/status")))


# --- LLM backends (registering, heartbeats and draining need an admin token) ------------------
def list_backends(client: CallingClient) -> Call[list[dict[str, Any]]]:
    """GET /v1/backends."""
    return decode((yield from request(client, "GET", "/v1/backends")))["backends"]


def register_backend(
    client: CallingClient,
    url: str,
    model: str,
    *,
    backend_id: str | None = None,
    tokenizer: str | None = None,
    capacity: float | None = None,
    labels: dict[str, str] | None = None,
) -> Call[dict[str, Any]]:
    """POST /v1/backends."""
    body = backend_body(url, model, backend_id, tokenizer, capacity, labels)
    return decode((yield from request(client, "POST", "/v1/backends", json=body)), (201,))


def backend_heartbeat(client: CallingClient, backend_id: str) -> Call[dict[str, Any]]:
    """POST /v1/backends/{id}/heartbeat."""
    return decode((yield from request(client, "POST", f"/v1/backends/{backend_id}/heartbeat")))


def drain_backend(client: CallingClient, backend_id: str, draining: bool = True) -> Call[dict[str, Any]]:
    """POST /v1/backends/{id}/drain."""
    path = f"/v1/backends/{backend_id}/drain"
    return decode((yield from request(client, "POST", path, json={"draining": draining})))


def update_weights(
    client: CallingClient,
    model: str,
    version: str,
    *,
    path: str,
    pause_mode: str = "wait",
    lora: str | None = None,
    timeout: float = 900.0,
) -> Call[dict[str, Any]]:
    """POST /v1/models/{model}/weights, with the request's timeout raised to the update's."""
    body = weights_body(version, path, pause_mode, lora)
    return decode((yield from request(client, "POST", weights_path(model), json=body, timeout=timeout)))


def upload_weights(
    client: CallingClient, model: str, version: str, data: bytes, *, pause_mode: str = "wait", timeout: float = 900.0
) -> Call[dict[str, Any]]:
    """PUT /v1/models/{model}/weights with the safetensors bytes as the body."""
    upload = weights_upload(version, data, pause_mode)
    return decode((yield from request(client, "PUT", weights_path(model), timeout=timeout, **upload)))


def current_weights(client: CallingClient, model: str) -> Call[dict[str, Any]]:
    """GET /v1/models/{model}/weights."""
    return decode((yield from request(client, "GET", weights_path(model))))


def declare_weights(
    client: CallingClient, model: str, version: str, backends: list[str], *, owner: str = "trainer"
) -> Call[dict[str, Any]]:
    """POST /v1/models/{model}/weights/declare."""
    body = {"version": version, "backends": list(backends), "owner": owner}
    return decode((yield from request(client, "POST", f"{weights_path(model)}/declare", json=body)))


def deregister_backend(client: CallingClient, backend_id: str) -> Call[bool]:
    """DELETE /v1/backends/{id}; a 404 means it was not registered."""
    response = yield from request(client, "DELETE", f"/v1/backends/{backend_id}")
    if response.status_code == 404:
        return False
    if response.status_code != 204:
        raise ApiError(response)
    return True
