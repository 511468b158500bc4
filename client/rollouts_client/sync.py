"""RolloutClient: the synchronous client a trainer imports (httpx)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx

from rollouts_client.errors import ApiError, BatchExhausted, WaitTimeout
from rollouts_client.models import Batch, BatchStatus, Group, GroupPage, Job
from rollouts_client.wire import (
    RESULTS_PAGE_GROUPS,
    RetryPolicy,
    SseParser,
    backend_body,
    batch_body,
    decode,
    endpoint,
    headers,
    list_params,
    weights_body,
    weights_path,
    weights_upload,
)
from rollouts_client.wire import StreamUnavailable as _Unavailable

LIST_CHUNK = 500


class RolloutClient:
    """Submit jobs and batches, wait for them, stream a batch's groups, cancel; register LLM backends.

    `base_url` and `token` default to the environment's ROLLOUTS_API_URL and
    ROLLOUTS_API_TOKEN, so a job script can point a trainer at the service without
    code changes. Responses come as msgpack by default (`msgpack=False` for JSON);
    connection errors and 503s are retried (see RetryPolicy).
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        msgpack: bool = True,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base_url, token = endpoint(base_url, token)
        self.retry = retry or RetryPolicy()
        self.http = httpx.Client(
            base_url=base_url, headers=headers(token, msgpack), timeout=timeout, transport=transport
        )

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        delays = iter(self.retry.delays())
        has_key = "Idempotency-Key" in (kwargs.get("headers") or {})
        while True:
            error: Exception | None = None
            response: httpx.Response | None = None
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                error = exc
            delay = next(delays, None) if self.retry.retryable(method, error, response, has_key) else None
            if delay is None:
                if error is not None:
                    raise error
                assert response is not None
                return response
            time.sleep(delay)

    # --- jobs -------------------------------------------------------------------
    def submit_jobs(
        self, jobs: list[dict[str, Any]] | dict[str, Any], *, idempotency_key: str | None = None
    ) -> list[str]:
        """Submit one job or a list; returns their ids. With `idempotency_key` (the Idempotency-Key
        header) a retry of the same request answers with the same jobs; another request under the
        same key is an ApiError 409."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return decode(self.request("POST", "/v1/jobs", json=jobs, headers=headers), (202,))["job_ids"]

    def get_job(self, job_id: str) -> Job:
        return Job.from_api(decode(self.request("GET", f"/v1/jobs/{job_id}")))

    def job_summaries(self, job_ids: list[str]) -> list[Job]:
        """Status and reward of many jobs in few requests (no trajectories)."""
        out: list[Job] = []
        for start in range(0, len(job_ids), LIST_CHUNK):
            chunk = job_ids[start : start + LIST_CHUNK]
            page = decode(self.request("GET", "/v1/jobs", params={"ids": ",".join(chunk), "limit": len(chunk)}))
            out.extend(Job.from_api(j) for j in page["jobs"])
        return out

    def list_jobs(
        self, *, status: str | None = None, group_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Job]:
        """One page of job summaries (status, reward; no trajectories), newest first, filtered by status or group."""
        params = list_params(status, group_id, limit, offset)
        return [Job.from_api(j) for j in decode(self.request("GET", "/v1/jobs", params=params))["jobs"]]

    def iter_jobs(
        self, *, status: str | None = None, group_id: str | None = None, page_size: int = 500
    ) -> Iterator[Job]:
        """Every job summary, newest first (by group: in sample order), page after page by cursor:
        jobs submitted meanwhile neither repeat nor push others out, as they would with offsets."""
        cursor: str | None = None
        while True:
            params = list_params(status, group_id, page_size, cursor=cursor)
            page = decode(self.request("GET", "/v1/jobs", params=params))
            yield from (Job.from_api(j) for j in page["jobs"])
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def wait_jobs(self, job_ids: list[str], timeout: float | None = None, poll_s: float = 0.5) -> list[Job]:
        """Block until every job is terminal; the full records, in the order given. WaitTimeout past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(dict.fromkeys(job_ids))
        while pending:
            pending = [j.id for j in self.job_summaries(pending) if not j.finished]
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"{len(pending)} of {len(job_ids)} jobs still running after {timeout}s")
            time.sleep(poll_s)
        return [self.get_job(job_id) for job_id in job_ids]

    def cancel_job(self, job_id: str) -> bool:
        """True when cancelled now, False when it had already finished."""
        response = self.request("DELETE", f"/v1/jobs/{job_id}")
        if response.status_code == 409:
            return False
        decode(response)
        return True

    # --- batches ----------------------------------------------------------------
    def submit_batch(
        self,
        prompts: list[dict[str, Any]] | None = None,
        *,
        prompts_path: str | None = None,
        n_samples: int = 8,
        min_informative_groups: int | None = None,
        **options: Any,
    ) -> Batch:
        """Options: sampling, limits, max_groups_in_flight, on_target, advantages, reward_epsilon, max_staleness, metadata."""
        body = batch_body(prompts, prompts_path, n_samples, min_informative_groups, options)
        return Batch.from_api(decode(self.request("POST", "/v1/batches", json=body), (202,)))

    def get_batch(self, batch_id: str) -> Batch:
        return Batch.from_api(decode(self.request("GET", f"/v1/batches/{batch_id}")))

    def cancel_batch(self, batch_id: str) -> Batch | None:
        """The batch after cancelling, or None when it had already finished."""
        response = self.request("DELETE", f"/v1/batches/{batch_id}")
        if response.status_code == 409:
            return None
        return Batch.from_api(decode(response))

    def groups(
        self, batch_id: str, after: str = "0-0", wait: float = 20.0, results: bool = False, limit: int | None = None
    ) -> GroupPage:
        """One long-poll: groups completed after `after`, waiting up to `wait` s for the first."""
        params: dict[str, Any] = {"after": after, "wait": wait, "results": str(results).lower()}
        if limit is not None:
            params["limit"] = limit
        response = self.request("GET", f"/v1/batches/{batch_id}/groups", params=params, timeout=wait + 30)
        return GroupPage.from_api(decode(response))

    def iter_groups(
        self, batch_id: str, *, results: bool = True, timeout: float | None = None, after: str = "0-0"
    ) -> Iterator[Group]:
        """Every reported group once, as soon as it completes, until the batch ends (long-poll)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = after
        while True:
            wait = 20.0 if deadline is None else max(0.0, min(20.0, deadline - time.monotonic()))
            page = self.groups(batch_id, cursor, wait, results, RESULTS_PAGE_GROUPS if results else None)
            yield from page.groups
            cursor = page.cursor
            if page.done:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"batch {batch_id} still running after {timeout}s")

    def iter_events(self, batch_id: str, *, results: bool = False, timeout: float | None = None) -> Iterator[Group]:
        """The same groups over server-sent events; a dropped connection resumes after the last event."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id = "0-0"
        delays = iter(self.retry.delays())
        while True:
            try:
                with self.http.stream(
                    "GET",
                    f"/v1/batches/{batch_id}/events",
                    params={"results": str(results).lower()},
                    headers={"Accept": "text/event-stream", "Last-Event-ID": last_id},
                    timeout=httpx.Timeout(self.http.timeout.connect, read=60.0),
                ) as response:
                    if response.status_code != 200:
                        response.read()
                        if RetryPolicy.retryable("GET", None, response):
                            raise _Unavailable(response)
                        decode(response)
                    delays = iter(self.retry.delays())  # connected: the next drop starts the backoff afresh
                    parser = SseParser()
                    for line in response.iter_lines():
                        if deadline is not None and time.monotonic() >= deadline:
                            raise WaitTimeout(f"batch {batch_id} still running after {timeout}s")
                        event = parser.feed(line)
                        if event is None:
                            continue
                        name, event_id, data = event
                        if name == "end":
                            return
                        last_id = event_id or last_id
                        yield Group.from_api(data)
            except (httpx.TransportError, _Unavailable) as exc:
                delay = next(delays, None)
                if delay is None:
                    if isinstance(exc, _Unavailable):
                        raise exc.error from None
                    raise
                time.sleep(delay)

    def wait_batch(self, batch_id: str, timeout: float | None = None) -> Batch:
        """Block until the batch closes (target met or cancelled); BatchExhausted when a DAPO pool ran
        out before the target (the groups it did fill are still there: `collect_groups`)."""
        for _ in self.iter_groups(batch_id, results=False, timeout=timeout):
            pass
        final = self.get_batch(batch_id)
        if final.status == BatchStatus.EXHAUSTED:
            raise BatchExhausted(final)
        return final

    def collect_groups(self, batch_id: str, *, results: bool = True, timeout: float | None = None) -> list[Group]:
        return list(self.iter_groups(batch_id, results=results, timeout=timeout))

    # --- the service ------------------------------------------------------------
    def health(self) -> bool:
        """Whether the API answers its health check now (one try, no token needed): for waiting on a start."""
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def status(self) -> dict[str, Any]:
        """Queues and workers: `stages` (queued, running, failed, processes, slots, busy_slots), `jobs`, `in_flight`;
        `redis` (used_bytes, limit_bytes, high_water, accepting) and `results` (root, bytes, files, healthy)."""
        return decode(self.request("GET", "/v1/status"))

    # --- LLM backends (registering, heartbeats and draining need an admin token) -
    def list_backends(self) -> list[dict[str, Any]]:
        """Every registered backend: id, url, model, capacity, labels, healthy, draining, inflight, ..."""
        return decode(self.request("GET", "/v1/backends"))["backends"]

    def register_backend(
        self,
        url: str,
        model: str,
        *,
        backend_id: str | None = None,
        tokenizer: str | None = None,
        capacity: float | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Add a vLLM server to the pool, or refresh it (the id defaults to one derived from the URL); its view."""
        body = backend_body(url, model, backend_id, tokenizer, capacity, labels)
        return decode(self.request("POST", "/v1/backends", json=body), (201,))

    def backend_heartbeat(self, backend_id: str) -> dict[str, Any]:
        """Keep a backend healthy; ApiError 404 when the pool forgot it (register it again)."""
        return decode(self.request("POST", f"/v1/backends/{backend_id}/heartbeat"))

    def drain_backend(self, backend_id: str, draining: bool = True) -> dict[str, Any]:
        """Stop new trajectories on a backend (running ones finish there); draining=False reopens it."""
        response = self.request("POST", f"/v1/backends/{backend_id}/drain", json={"draining": draining})
        return decode(response)

    def update_weights(
        self,
        model: str,
        version: str,
        *,
        path: str,
        pause_mode: str = "wait",
        lora: str | None = None,
        timeout: float = 900.0,
    ) -> dict[str, Any]:
        """Load a checkpoint into every backend of `model` under `version` (admin); what each backend did.

        `path`: a directory the backends and the API can read (a full checkpoint, or with `lora` the
        adapter to load in place under that name). `pause_mode`: keep, wait or abort running requests.
        Returns {model, version, seq, seconds, backends: [{id, url, status, seconds, error,
        removed_from_pool}]}. ApiError 409 while another update of the model runs, 422 for a version
        that goes backwards or a checkpoint that does not fit, 404 when no backend serves the model.
        """
        body = weights_body(version, path, pause_mode, lora)
        return decode(self.request("POST", weights_path(model), json=body, timeout=timeout))

    def upload_weights(
        self, model: str, version: str, data: bytes, *, pause_mode: str = "wait", timeout: float = 900.0
    ) -> dict[str, Any]:
        """Load weights sent as bytes into every backend of `model` under `version` (admin): no shared disk.

        `data`: one safetensors file with every tensor of the model, named and shaped as its
        checkpoint (e.g. `safetensors.torch.save(model.state_dict())` without tied duplicates), at
        most the service's max_weight_bytes. Returns and raises as `update_weights`; ApiError 422
        (field `body`) when the tensors do not fit the served model, 413 when it is too large.
        """
        upload = weights_upload(version, data, pause_mode)
        return decode(self.request("PUT", weights_path(model), timeout=timeout, **upload))

    def current_weights(self, model: str) -> dict[str, Any]:
        """The last version applied to `model` through the service: {model, version, seq, path, applied_at}."""
        return decode(self.request("GET", weights_path(model)))

    def declare_weights(
        self, model: str, version: str, backends: list[str], *, owner: str = "trainer"
    ) -> dict[str, Any]:
        """Record that `backends` (a trainer's own servers, updated in place by it) now serve `version` (admin);
        nothing is loaded. {model, version, seq, backends}. ApiError 422 for a version that goes backwards or
        a backend of another model, 404 for a backend that is not registered."""
        body = {"version": version, "backends": list(backends), "owner": owner}
        return decode(self.request("POST", f"{weights_path(model)}/declare", json=body))

    def deregister_backend(self, backend_id: str) -> bool:
        """Remove a backend from the pool; False when it was not registered."""
        response = self.request("DELETE", f"/v1/backends/{backend_id}")
        if response.status_code == 404:
            return False
        if response.status_code != 204:
            raise ApiError(response)
        return True
