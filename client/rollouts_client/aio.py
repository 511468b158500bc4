"""AsyncRolloutClient: the same API as RolloutClient for asyncio trainers (httpx.AsyncClient)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
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


class AsyncRolloutClient:
    """See RolloutClient; every method is a coroutine and the iterators are async.

    `base_url` and `token` default to ROLLOUTS_API_URL and ROLLOUTS_API_TOKEN, as there.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        msgpack: bool = True,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        base_url, token = endpoint(base_url, token)
        self.retry = retry or RetryPolicy()
        self.http = httpx.AsyncClient(
            base_url=base_url, headers=headers(token, msgpack), timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        delays = iter(self.retry.delays())
        has_key = "Idempotency-Key" in (kwargs.get("headers") or {})
        while True:
            error: Exception | None = None
            response: httpx.Response | None = None
            try:
                response = await self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                error = exc
            delay = next(delays, None) if self.retry.retryable(method, error, response, has_key) else None
            if delay is None:
                if error is not None:
                    raise error
                assert response is not None
                return response
            await asyncio.sleep(delay)

    # --- jobs -------------------------------------------------------------------
    async def submit_jobs(
        self, jobs: list[dict[str, Any]] | dict[str, Any], *, idempotency_key: str | None = None
    ) -> list[str]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return decode(await self.request("POST", "/v1/jobs", json=jobs, headers=headers), (202,))["job_ids"]

    async def get_job(self, job_id: str) -> Job:
        return Job.from_api(decode(await self.request("GET", f"/v1/jobs/{job_id}")))

    async def job_summaries(self, job_ids: list[str]) -> list[Job]:
        out: list[Job] = []
        for start in range(0, len(job_ids), LIST_CHUNK):
            chunk = job_ids[start : start + LIST_CHUNK]
            params = {"ids": ",".join(chunk), "limit": len(chunk)}
            page = decode(await self.request("GET", "/v1/jobs", params=params))
            out.extend(Job.from_api(j) for j in page["jobs"])
        return out

    async def list_jobs(
        self, *, status: str | None = None, group_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Job]:
        params = list_params(status, group_id, limit, offset)
        return [Job.from_api(j) for j in decode(await self.request("GET", "/v1/jobs", params=params))["jobs"]]

    async def iter_jobs(
        self, *, status: str | None = None, group_id: str | None = None, page_size: int = 500
    ) -> AsyncIterator[Job]:
        """Every job summary, page after page by cursor (see RolloutClient.iter_jobs)."""
        cursor: str | None = None
        while True:
            params = list_params(status, group_id, page_size, cursor=cursor)
            page = decode(await self.request("GET", "/v1/jobs", params=params))
            for job in page["jobs"]:
                yield Job.from_api(job)
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def wait_jobs(self, job_ids: list[str], timeout: float | None = None, poll_s: float = 0.5) -> list[Job]:
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(dict.fromkeys(job_ids))
        while pending:
            pending = [j.id for j in await self.job_summaries(pending) if not j.finished]
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"{len(pending)} of {len(job_ids)} jobs still running after {timeout}s")
            await asyncio.sleep(poll_s)
        return list(await asyncio.gather(*(self.get_job(job_id) for job_id in job_ids)))

    async def cancel_job(self, job_id: str) -> bool:
        response = await self.request("DELETE", f"/v1/jobs/{job_id}")
        if response.status_code == 409:
            return False
        decode(response)
        return True

    # --- batches ----------------------------------------------------------------
    async def submit_batch(
        self,
        prompts: list[dict[str, Any]] | None = None,
        *,
        prompts_path: str | None = None,
        n_samples: int = 8,
        min_informative_groups: int | None = None,
        **options: Any,
    ) -> Batch:
        body = batch_body(prompts, prompts_path, n_samples, min_informative_groups, options)
        return Batch.from_api(decode(await self.request("POST", "/v1/batches", json=body), (202,)))

    async def get_batch(self, batch_id: str) -> Batch:
        return Batch.from_api(decode(await self.request("GET", f"/v1/batches/{batch_id}")))

    async def cancel_batch(self, batch_id: str) -> Batch | None:
        response = await self.request("DELETE", f"/v1/batches/{batch_id}")
        if response.status_code == 409:
            return None
        return Batch.from_api(decode(response))

    async def groups(
        self, batch_id: str, after: str = "0-0", wait: float = 20.0, results: bool = False, limit: int | None = None
    ) -> GroupPage:
        params: dict[str, Any] = {"after": after, "wait": wait, "results": str(results).lower()}
        if limit is not None:
            params["limit"] = limit
        response = await self.request("GET", f"/v1/batches/{batch_id}/groups", params=params, timeout=wait + 30)
        return GroupPage.from_api(decode(response))

    async def iter_groups(
        self, batch_id: str, *, results: bool = True, timeout: float | None = None, after: str = "0-0"
    ) -> AsyncIterator[Group]:
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = after
        while True:
            wait = 20.0 if deadline is None else max(0.0, min(20.0, deadline - time.monotonic()))
            page = await self.groups(batch_id, cursor, wait, results, RESULTS_PAGE_GROUPS if results else None)
            for group in page.groups:
                yield group
            cursor = page.cursor
            if page.done:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"batch {batch_id} still running after {timeout}s")

    async def iter_events(
        self, batch_id: str, *, results: bool = False, timeout: float | None = None
    ) -> AsyncIterator[Group]:
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id = "0-0"
        delays = iter(self.retry.delays())
        while True:
            try:
                async with self.http.stream(
                    "GET",
                    f"/v1/batches/{batch_id}/events",
                    params={"results": str(results).lower()},
                    headers={"Accept": "text/event-stream", "Last-Event-ID": last_id},
                    timeout=httpx.Timeout(self.http.timeout.connect, read=60.0),
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                        if RetryPolicy.retryable("GET", None, response):
                            raise _Unavailable(response)
                        decode(response)
                    delays = iter(self.retry.delays())  # connected: the next drop starts the backoff afresh
                    parser = SseParser()
                    async for line in response.aiter_lines():
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
                await asyncio.sleep(delay)

    async def wait_batch(self, batch_id: str, timeout: float | None = None) -> Batch:
        """Block until the batch closes; BatchExhausted when a DAPO pool ran out before the target."""
        async for _ in self.iter_groups(batch_id, results=False, timeout=timeout):
            pass
        final = await self.get_batch(batch_id)
        if final.status == BatchStatus.EXHAUSTED:
            raise BatchExhausted(final)
        return final

    async def collect_groups(self, batch_id: str, *, results: bool = True, timeout: float | None = None) -> list[Group]:
        return [group async for group in self.iter_groups(batch_id, results=results, timeout=timeout)]

    # --- the service ------------------------------------------------------------
    async def health(self) -> bool:
        try:
            return (await self.http.get("/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    async def status(self) -> dict[str, Any]:
        return decode(await self.request("GET", "/v1/status"))

    # --- LLM backends -------------------------------------------------------------
    async def list_backends(self) -> list[dict[str, Any]]:
        return decode(await self.request("GET", "/v1/backends"))["backends"]

    async def register_backend(
        self,
        url: str,
        model: str,
        *,
        backend_id: str | None = None,
        tokenizer: str | None = None,
        capacity: float | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body = backend_body(url, model, backend_id, tokenizer, capacity, labels)
        return decode(await self.request("POST", "/v1/backends", json=body), (201,))

    async def backend_heartbeat(self, backend_id: str) -> dict[str, Any]:
        return decode(await self.request("POST", f"/v1/backends/{backend_id}/heartbeat"))

    async def drain_backend(self, backend_id: str, draining: bool = True) -> dict[str, Any]:
        response = await self.request("POST", f"/v1/backends/{backend_id}/drain", json={"draining": draining})
        return decode(response)

    async def update_weights(
        self,
        model: str,
        version: str,
        *,
        path: str,
        pause_mode: str = "wait",
        lora: str | None = None,
        timeout: float = 900.0,
    ) -> dict[str, Any]:
        body = weights_body(version, path, pause_mode, lora)
        return decode(await self.request("POST", weights_path(model), json=body, timeout=timeout))

    async def upload_weights(
        self, model: str, version: str, data: bytes, *, pause_mode: str = "wait", timeout: float = 900.0
    ) -> dict[str, Any]:
        upload = weights_upload(version, data, pause_mode)
        return decode(await self.request("PUT", weights_path(model), timeout=timeout, **upload))

    async def current_weights(self, model: str) -> dict[str, Any]:
        return decode(await self.request("GET", weights_path(model)))

    async def declare_weights(
        self, model: str, version: str, backends: list[str], *, owner: str = "trainer"
    ) -> dict[str, Any]:
        body = {"version": version, "backends": list(backends), "owner": owner}
        return decode(await self.request("POST", f"{weights_path(model)}/declare", json=body))

    async def deregister_backend(self, backend_id: str) -> bool:
        response = await self.request("DELETE", f"/v1/backends/{backend_id}")
        if response.status_code == 404:
            return False
        if response.status_code != 204:
            raise ApiError(response)
        return True
