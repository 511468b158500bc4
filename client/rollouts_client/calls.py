"""Every API call, defined once: the request it sends, how it reads the answer, its errors and retries.

Each call is a generator of steps (steps.py) that does no I/O: RolloutClient and
AsyncRolloutClient perform its steps, and `ApiMethods` at the end makes each call a method of
both, with the call's parameters and docstring. `client` is the client the method was called on.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from rollouts_client.errors import ApiError, BatchExhausted, WaitTimeout
from rollouts_client.models import Batch, BatchStatus, Group, GroupPage, Job
from rollouts_client.steps import (
    Call,
    CloseStream,
    Defined,
    Emit,
    Gather,
    NextLine,
    OpenStream,
    Send,
    Session,
    Sleep,
    Stream,
    call,
    collect,
    stream,
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
LONG_POLL_S = 20.0  # how long one groups() request waits for a group
STREAM_READ_S = 60.0  # the longest quiet on an event stream before it counts as dropped


def request(client: Session, method: str, path: str, **kwargs: Any) -> Call[httpx.Response]:
    """One API request, retried as RetryPolicy says (connection errors, 503s); the last response,
    or the last transport error raised. `kwargs` are httpx's (params, json, headers, timeout, ...)."""
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
    client: Session, jobs: list[dict[str, Any]] | dict[str, Any], *, idempotency_key: str | None = None
) -> Call[list[str]]:
    """Submit one job or a list; returns their ids. With `idempotency_key` (the Idempotency-Key
    header) a retry of the same request answers with the same jobs; another request under the
    same key is an ApiError 409."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    response = yield from request(client, "POST", "/v1/jobs", json=jobs, headers=headers)
    return decode(response, (202,))["job_ids"]


def get_job(client: Session, job_id: str) -> Call[Job]:
    """One job's full record: status, reward, trajectory, timings; ApiError 404 for an unknown id."""
    return Job.from_api(decode((yield from request(client, "GET", f"/v1/jobs/{job_id}"))))


def job_summaries(client: Session, job_ids: list[str], wait_s: float = 0.0) -> Call[list[Job]]:
    """Status and reward of many jobs in few requests (no trajectories).

    `wait_s` (ids that fit one request, LIST_CHUNK): a long poll, answered once one of them has ended
    or after `wait_s` seconds (the service pushes the end; at most MAX_WAIT_S)."""
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
    client: Session, *, status: str | None = None, group_id: str | None = None, limit: int = 100, offset: int = 0
) -> Call[list[Job]]:
    """One page of job summaries (status, reward; no trajectories), newest first, filtered by status or group."""
    params = list_params(status, group_id, limit, offset)
    return [Job.from_api(j) for j in decode((yield from request(client, "GET", "/v1/jobs", params=params)))["jobs"]]


def iter_jobs(
    client: Session, *, status: str | None = None, group_id: str | None = None, page_size: int = 500
) -> Stream[Job]:
    """Every job summary, newest first (by group: in sample order), page after page by cursor:
    jobs submitted meanwhile neither repeat nor push others out, as they would with offsets."""
    cursor: str | None = None
    while True:
        params = list_params(status, group_id, page_size, cursor=cursor)
        page = decode((yield from request(client, "GET", "/v1/jobs", params=params)))
        for job in page["jobs"]:
            yield Emit(Job.from_api(job))
        cursor = page.get("next_cursor")
        if not cursor:
            return


def wait_jobs(
    client: Session, job_ids: list[str], timeout: float | None = None, poll_s: float = 0.5
) -> Call[list[Job]]:
    """Block until every job is terminal; the full records, in the order given. WaitTimeout past `timeout`.

    Up to LIST_CHUNK jobs are waited for with the service's long poll (each end is seen as it happens);
    more, or a service that answers a long poll at once, are polled every `poll_s`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(dict.fromkeys(job_ids))
    while pending:
        left = MAX_WAIT_S if deadline is None else max(0.0, deadline - time.monotonic())
        wait_s = min(MAX_WAIT_S / 2, left) if len(pending) <= LIST_CHUNK else 0.0
        asked = time.monotonic()
        still = [j.id for j in (yield from job_summaries(client, pending, wait_s)) if not j.finished]
        ended, pending = len(still) < len(pending), still
        if not pending:
            break
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"{len(pending)} of {len(job_ids)} jobs still running after {timeout}s")
        if not ended and time.monotonic() - asked < poll_s:  # no long poll here: poll, don't spin
            yield Sleep(poll_s)
    return (yield Gather([get_job(client, job_id) for job_id in job_ids]))


def cancel_job(client: Session, job_id: str) -> Call[bool]:
    """True when cancelled now, False when it had already finished."""
    response = yield from request(client, "DELETE", f"/v1/jobs/{job_id}")
    if response.status_code == 409:
        return False
    decode(response)
    return True


# --- batches ----------------------------------------------------------------------------------
def submit_batch(
    client: Session,
    prompts: list[dict[str, Any]] | None = None,
    *,
    prompts_path: str | None = None,
    n_samples: int = 8,
    min_informative_groups: int | None = None,
    **options: Any,
) -> Call[Batch]:
    """Options: sampling, limits, max_groups_in_flight, on_target, advantages, reward_epsilon, max_staleness, metadata."""
    body = batch_body(prompts, prompts_path, n_samples, min_informative_groups, options)
    return Batch.from_api(decode((yield from request(client, "POST", "/v1/batches", json=body)), (202,)))


def get_batch(client: Session, batch_id: str) -> Call[Batch]:
    """The batch now: status, counts, reason; ApiError 404 for an unknown id."""
    return Batch.from_api(decode((yield from request(client, "GET", f"/v1/batches/{batch_id}"))))


def cancel_batch(client: Session, batch_id: str) -> Call[Batch | None]:
    """The batch after cancelling, or None when it had already finished."""
    response = yield from request(client, "DELETE", f"/v1/batches/{batch_id}")
    if response.status_code == 409:
        return None
    return Batch.from_api(decode(response))


def groups(
    client: Session,
    batch_id: str,
    after: str = "0-0",
    wait: float = LONG_POLL_S,
    results: bool = False,
    limit: int | None = None,
) -> Call[GroupPage]:
    """One long-poll: groups completed after `after`, waiting up to `wait` s for the first."""
    params: dict[str, Any] = {"after": after, "wait": wait, "results": str(results).lower()}
    if limit is not None:
        params["limit"] = limit
    path = f"/v1/batches/{batch_id}/groups"
    return GroupPage.from_api(decode((yield from request(client, "GET", path, params=params, timeout=wait + 30))))


def iter_groups(
    client: Session,
    batch_id: str,
    *,
    results: bool = True,
    timeout: float | None = None,
    after: str = "0-0",
    partial: bool = False,
) -> Stream[Group]:
    """Every reported group once, as soon as it completes, until the batch ends (long-poll).

    A DAPO batch whose prompts ran out before its target ends the iteration with BatchExhausted
    (the groups it got, of how many, and why), so a trainer does not go on with a short batch in
    silence; `partial=True` ends it quietly after the last group instead."""
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
    client: Session, batch_id: str, *, results: bool = False, timeout: float | None = None, partial: bool = False
) -> Stream[Group]:
    """The same groups over server-sent events; a dropped connection resumes after the last event.
    Ends as `iter_groups` does: BatchExhausted for a batch that could not fill, unless `partial`."""
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


def wait_batch(client: Session, batch_id: str, timeout: float | None = None) -> Call[Batch]:
    """Block until the batch closes (target met or cancelled); BatchExhausted when a DAPO pool ran
    out before the target (the groups it did fill are still there: `collect_groups(partial=True)`)."""
    yield from collect(iter_groups(client, batch_id, results=False, timeout=timeout, partial=True), keep=False)
    final = yield from get_batch(client, batch_id)
    if final.status == BatchStatus.EXHAUSTED:
        raise BatchExhausted(final)
    return final


def collect_groups(
    client: Session, batch_id: str, *, results: bool = True, timeout: float | None = None, partial: bool = False
) -> Call[list[Group]]:
    """Every group of the batch, as a list once it ends (iter_groups, collected: BatchExhausted for a
    batch that could not fill, unless `partial`, which returns the groups it did fill)."""
    return (yield from collect(iter_groups(client, batch_id, results=results, timeout=timeout, partial=partial)))


# --- the service ------------------------------------------------------------------------------
def health(client: Session) -> Call[bool]:
    """Whether the API answers its health check now (one try, no token needed): for waiting on a start."""
    try:
        return (yield Send("GET", "/healthz")).status_code == 200
    except httpx.TransportError:
        return False


def status(client: Session) -> Call[dict[str, Any]]:
    """Queues and workers: `stages` (queued, running, failed, processes, slots, busy_slots), `jobs`, `in_flight`;
    `redis` (used_bytes, limit_bytes, high_water, accepting) and `results` (root, bytes, files, healthy)."""
    return decode((yield from request(client, "GET", "/v1/status")))


# --- LLM backends (registering, heartbeats and draining need an admin token) ------------------
def list_backends(client: Session) -> Call[list[dict[str, Any]]]:
    """Every registered backend: id, url, model, capacity, labels, healthy, draining, inflight, ..."""
    return decode((yield from request(client, "GET", "/v1/backends")))["backends"]


def register_backend(
    client: Session,
    url: str,
    model: str,
    *,
    backend_id: str | None = None,
    tokenizer: str | None = None,
    capacity: float | None = None,
    labels: dict[str, str] | None = None,
) -> Call[dict[str, Any]]:
    """Add a vLLM server to the pool, or refresh it (the id defaults to one derived from the URL); its view."""
    body = backend_body(url, model, backend_id, tokenizer, capacity, labels)
    return decode((yield from request(client, "POST", "/v1/backends", json=body)), (201,))


def backend_heartbeat(client: Session, backend_id: str) -> Call[dict[str, Any]]:
    """Keep a backend healthy; ApiError 404 when the pool forgot it (register it again)."""
    return decode((yield from request(client, "POST", f"/v1/backends/{backend_id}/heartbeat")))


def drain_backend(client: Session, backend_id: str, draining: bool = True) -> Call[dict[str, Any]]:
    """Stop new trajectories on a backend (running ones finish there); draining=False reopens it."""
    path = f"/v1/backends/{backend_id}/drain"
    return decode((yield from request(client, "POST", path, json={"draining": draining})))


def update_weights(
    client: Session,
    model: str,
    version: str,
    *,
    path: str,
    pause_mode: str = "wait",
    lora: str | None = None,
    timeout: float = 900.0,
) -> Call[dict[str, Any]]:
    """Load a checkpoint into every backend of `model` under `version` (admin); what each backend did.

    `path`: a directory the backends and the API can read (a full checkpoint, or with `lora` the
    adapter to load in place under that name). `pause_mode`: keep, wait or abort running requests.
    Returns {model, version, seq, seconds, backends: [{id, url, status, seconds, error,
    removed_from_pool}]}. ApiError 409 while another update of the model runs, 422 for a version
    that goes backwards or a checkpoint that does not fit, 404 when no backend serves the model.
    """
    body = weights_body(version, path, pause_mode, lora)
    return decode((yield from request(client, "POST", weights_path(model), json=body, timeout=timeout)))


def upload_weights(
    client: Session, model: str, version: str, data: bytes, *, pause_mode: str = "wait", timeout: float = 900.0
) -> Call[dict[str, Any]]:
    """Load weights sent as bytes into every backend of `model` under `version` (admin): no shared disk.

    `data`: one safetensors file with every tensor of the model, named and shaped as its
    checkpoint (e.g. `safetensors.torch.save(model.state_dict())` without tied duplicates), at
    most the service's max_weight_bytes. Returns and raises as `update_weights`; ApiError 422
    (field `body`) when the tensors do not fit the served model, 413 when it is too large.
    """
    upload = weights_upload(version, data, pause_mode)
    return decode((yield from request(client, "PUT", weights_path(model), timeout=timeout, **upload)))


def current_weights(client: Session, model: str) -> Call[dict[str, Any]]:
    """The last version applied to `model` through the service: {model, version, seq, path, applied_at}."""
    return decode((yield from request(client, "GET", weights_path(model))))


def declare_weights(
    client: Session, model: str, version: str, backends: list[str], *, owner: str = "trainer"
) -> Call[dict[str, Any]]:
    """Record that `backends` (a trainer's own servers, updated in place by it) now serve `version` (admin);
    nothing is loaded. {model, version, seq, backends}. ApiError 422 for a version that goes backwards or
    a backend of another model, 404 for a backend that is not registered."""
    body = {"version": version, "backends": list(backends), "owner": owner}
    return decode((yield from request(client, "POST", f"{weights_path(model)}/declare", json=body)))


def deregister_backend(client: Session, backend_id: str) -> Call[bool]:
    """Remove a backend from the pool; False when it was not registered."""
    response = yield from request(client, "DELETE", f"/v1/backends/{backend_id}")
    if response.status_code == 404:
        return False
    if response.status_code != 204:
        raise ApiError(response)
    return True


# --- the clients' methods -----------------------------------------------------------------------
class ApiMethods:
    """The public methods of both clients, each the call of its name above, which documents it.

    A client class that defines `_method` (how it runs a call) gets each as a method of its own
    when it is created: RolloutClient's return results, AsyncRolloutClient's are coroutines and
    its iterators async. The declarations here give type checkers both shapes (steps.call).
    """

    request = call(request)
    submit_jobs = call(submit_jobs)
    get_job = call(get_job)
    job_summaries = call(job_summaries)
    list_jobs = call(list_jobs)
    iter_jobs = stream(iter_jobs)
    wait_jobs = call(wait_jobs)
    cancel_job = call(cancel_job)
    submit_batch = call(submit_batch)
    get_batch = call(get_batch)
    cancel_batch = call(cancel_batch)
    groups = call(groups)
    iter_groups = stream(iter_groups)
    iter_events = stream(iter_events)
    wait_batch = call(wait_batch)
    collect_groups = call(collect_groups)
    health = call(health)
    status = call(status)
    list_backends = call(list_backends)
    register_backend = call(register_backend)
    backend_heartbeat = call(backend_heartbeat)
    drain_backend = call(drain_backend)
    update_weights = call(update_weights)
    upload_weights = call(upload_weights)
    current_weights = call(current_weights)
    declare_weights = call(declare_weights)
    deregister_backend = call(deregister_backend)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        make = cls.__dict__.get("_method")
        if make is None:  # a subclass of a client: it has them already (and may override some)
            return
        for name, defined in vars(ApiMethods).items():
            if isinstance(defined, Defined):
                setattr(cls, name, make.__get__(None, cls)(defined))  # a classmethod: the class is not bound yet
