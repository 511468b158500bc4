"""AsyncRolloutClient: RolloutClient's methods for asyncio trainers. Each is written here and runs the
call of its name (calls.py) with httpx.AsyncClient and asyncio.sleep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import httpx

from rollouts_client import calls, steps
from rollouts_client.models import Batch, Group, GroupPage, Job, JobsProgress
from rollouts_client.wire import RetryPolicy, endpoint, headers

T = TypeVar("T")


class AsyncRolloutClient:
    """RolloutClient's methods, each a coroutine, and its iterators async (`async for`).

    `base_url` and `token` default to ROLLOUTS_API_URL and ROLLOUTS_API_TOKEN, as there.
    `wait_jobs` fetches the finished jobs concurrently.
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
        """Close the connections (an `async with` block does it on leaving)."""
        await self.http.aclose()

    async def _run(self, call: steps.Call[T]) -> T:
        return await run(self.http, call)

    def _iterate(self, stream: steps.Stream[T]) -> AsyncIterator[T]:
        return drive(self.http, stream)

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One API request, retried as RetryPolicy says (connection errors, 503s); the last response,
        or the last transport error raised. `kwargs` are httpx's (params, json, headers, timeout, ...)."""
        return await self._run(calls.request(self, method, path, **kwargs))

    # --- jobs ---------------------------------------------------------------------------------
    async def submit_jobs(
        self, jobs: list[dict[str, Any]] | dict[str, Any], *, idempotency_key: str | None = None
    ) -> list[str]:
        """Submit one job or a list; returns their ids. With `idempotency_key` (the Idempotency-Key
        header) a retry of the same request answers with the same jobs; another request under the
        same key is an ApiError 409."""
        return await self._run(calls.submit_jobs(self, jobs, idempotency_key=idempotency_key))

    async def get_job(self, job_id: str) -> Job:
        """One job's full record: status, reward, trajectory, timings; ApiError 404 for an unknown id."""
        return await self._run(calls.get_job(self, job_id))

    async def job_summaries(self, job_ids: list[str], wait_s: float = 0.0) -> list[Job]:
        """Status and reward of many jobs in few requests (no trajectories).

        `wait_s` (ids that fit one request, LIST_CHUNK): a long poll, answered once one of them has ended
        or after `wait_s` seconds (the service pushes the end; at most MAX_WAIT_S)."""
        return await self._run(calls.job_summaries(self, job_ids, wait_s))

    async def list_jobs(
        self, *, status: str | None = None, group_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Job]:
        """One page of job summaries (status, reward; no trajectories), newest first, filtered by status or group."""
        return await self._run(calls.list_jobs(self, status=status, group_id=group_id, limit=limit, offset=offset))

    def iter_jobs(
        self, *, status: str | None = None, group_id: str | None = None, page_size: int = 500
    ) -> AsyncIterator[Job]:
        """Every job summary, newest first (by group: in sample order), page after page by cursor:
        jobs submitted meanwhile neither repeat nor push others out, as they would with offsets."""
        return self._iterate(calls.iter_jobs(self, status=status, group_id=group_id, page_size=page_size))

    def watch_jobs(
        self,
        job_ids: list[str],
        timeout: float | None = None,
        poll_s: float = 0.5,
        *,
        max_poll_s: float | None = None,
        update_s: float = calls.JOBS_LONG_POLL_S,
    ) -> AsyncIterator[JobsProgress]:
        """Follow jobs until every one is terminal: after each answer of the service, a JobsProgress (the
        summaries of the jobs that ended since the last, and of those still running; no results).
        WaitTimeout past `timeout`.

        Up to LIST_CHUNK jobs are followed with the service's long poll: an end is seen as it happens, and
        an answer comes at least every `update_s`. More, or a service that answers a long poll at once, are
        polled every `poll_s`, doubling to `max_poll_s` (default `poll_s`) while nothing ends."""
        return self._iterate(calls.watch_jobs(self, job_ids, timeout, poll_s, max_poll_s=max_poll_s, update_s=update_s))

    async def wait_jobs(self, job_ids: list[str], timeout: float | None = None, poll_s: float = 0.5) -> list[Job]:
        """Block until every job is terminal; the full records, in the order given. WaitTimeout past `timeout`.

        Up to LIST_CHUNK jobs are waited for with the service's long poll (each end is seen as it happens);
        more, or a service that answers a long poll at once, are polled every `poll_s`."""
        return await self._run(calls.wait_jobs(self, job_ids, timeout, poll_s))

    async def cancel_job(self, job_id: str) -> bool:
        """True when cancelled now, False when it had already finished."""
        return await self._run(calls.cancel_job(self, job_id))

    # --- batches ------------------------------------------------------------------------------
    async def submit_batch(
        self,
        prompts: list[dict[str, Any]] | None = None,
        *,
        prompts_path: str | None = None,
        n_samples: int = 8,
        min_informative_groups: int | None = None,
        **options: Any,
    ) -> Batch:
        """Options: sampling, limits, max_groups_in_flight, on_target, advantages, reward_epsilon, max_staleness, metadata."""
        return await self._run(
            calls.submit_batch(
                self,
                prompts,
                prompts_path=prompts_path,
                n_samples=n_samples,
                min_informative_groups=min_informative_groups,
                **options,
            )
        )

    async def get_batch(self, batch_id: str) -> Batch:
        """The batch now: status, counts, reason; ApiError 404 for an unknown id."""
        return await self._run(calls.get_batch(self, batch_id))

    async def cancel_batch(self, batch_id: str) -> Batch | None:
        """The batch after cancelling, or None when it had already finished."""
        return await self._run(calls.cancel_batch(self, batch_id))

    async def groups(
        self,
        batch_id: str,
        after: str = "0-0",
        wait: float = calls.LONG_POLL_S,
        results: bool = False,
        limit: int | None = None,
    ) -> GroupPage:
        """One long-poll: groups completed after `after`, waiting up to `wait` s for the first."""
        return await self._run(calls.groups(self, batch_id, after, wait, results, limit))

    def iter_groups(
        self,
        batch_id: str,
        *,
        results: bool = True,
        timeout: float | None = None,
        after: str = "0-0",
        partial: bool = False,
    ) -> AsyncIterator[Group]:
        """Every reported group once, as soon as it completes, until the batch ends (long-poll).

        A DAPO batch whose prompts ran out before its target ends the iteration with BatchExhausted
        (the groups it got, of how many, and why), so a trainer does not go on with a short batch in
        silence; `partial=True` ends it quietly after the last group instead."""
        return self._iterate(
            calls.iter_groups(self, batch_id, results=results, timeout=timeout, after=after, partial=partial)
        )

    def iter_events(
        self, batch_id: str, *, results: bool = False, timeout: float | None = None, partial: bool = False
    ) -> AsyncIterator[Group]:
        """The same groups over server-sent events; a dropped connection resumes after the last event.
        Ends as `iter_groups` does: BatchExhausted for a batch that could not fill, unless `partial`."""
        return self._iterate(calls.iter_events(self, batch_id, results=results, timeout=timeout, partial=partial))

    async def wait_batch(self, batch_id: str, timeout: float | None = None) -> Batch:
        """Block until the batch closes (target met or cancelled); BatchExhausted when a DAPO pool ran
        out before the target (the groups it did fill are still there: `collect_groups(partial=True)`)."""
        return await self._run(calls.wait_batch(self, batch_id, timeout))

    async def collect_groups(
        self, batch_id: str, *, results: bool = True, timeout: float | None = None, partial: bool = False
    ) -> list[Group]:
        """Every group of the batch, as a list once it ends (iter_groups, collected: BatchExhausted for a
        batch that could not fill, unless `partial`, which returns the groups it did fill)."""
        return await self._run(calls.collect_groups(self, batch_id, results=results, timeout=timeout, partial=partial))

    # --- the service --------------------------------------------------------------------------
    async def health(self) -> bool:
        """Whether the API answers its health check now (one try, no token needed): for waiting on a start."""
        return await self._run(calls.health(self))

    async def status(self) -> dict[str, Any]:
        """Queues and workers: `stages` (queued, running, failed, processes, slots, busy_slots), `jobs`, `in_flight`;
        `redis` (used_bytes, limit_bytes, high_water, accepting) and `results` (root, bytes, files, healthy)."""
        return await self._run(calls.status(self))

    # --- LLM backends and weights (registering, heartbeats, draining, weights need an admin token)
    async def list_backends(self) -> list[dict[str, Any]]:
        """Every registered backend: id, url, model, capacity, labels, healthy, draining, inflight, ..."""
        return await self._run(calls.list_backends(self))

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
        """Add a vLLM server to the pool, or refresh it (the id defaults to one derived from the URL); its view."""
        return await self._run(
            calls.register_backend(
                self, url, model, backend_id=backend_id, tokenizer=tokenizer, capacity=capacity, labels=labels
            )
        )

    async def backend_heartbeat(self, backend_id: str) -> dict[str, Any]:
        """Keep a backend healthy; ApiError 404 when the pool forgot it (register it again)."""
        return await self._run(calls.backend_heartbeat(self, backend_id))

    async def drain_backend(self, backend_id: str, draining: bool = True) -> dict[str, Any]:
        """Stop new trajectories on a backend (running ones finish there); draining=False reopens it."""
        return await self._run(calls.drain_backend(self, backend_id, draining))

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
        """Load a checkpoint into every backend of `model` under `version` (admin); what each backend did.

        `path`: a directory the backends and the API can read (a full checkpoint, or with `lora` the
        adapter to load in place under that name). `pause_mode`: keep, wait or abort running requests.
        Returns {model, version, seq, seconds, backends: [{id, url, status, seconds, error,
        removed_from_pool}]}. ApiError 409 while another update of the model runs, 422 for a version
        that goes backwards or a checkpoint that does not fit, 404 when no backend serves the model.
        """
        return await self._run(
            calls.update_weights(self, model, version, path=path, pause_mode=pause_mode, lora=lora, timeout=timeout)
        )

    async def upload_weights(
        self, model: str, version: str, data: bytes, *, pause_mode: str = "wait", timeout: float = 900.0
    ) -> dict[str, Any]:
        """Load weights sent as bytes into every backend of `model` under `version` (admin): no shared disk.

        `data`: one safetensors file with every tensor of the model, named and shaped as its
        checkpoint (e.g. `safetensors.torch.save(model.state_dict())` without tied duplicates), at
        most the service's max_weight_bytes. Returns and raises as `update_weights`; ApiError 422
        (field `body`) when the tensors do not fit the served model, 413 when it is too large.
        """
        return await self._run(calls.upload_weights(self, model, version, data, pause_mode=pause_mode, timeout=timeout))

    async def current_weights(self, model: str) -> dict[str, Any]:
        """The last version applied to `model` through the service: {model, version, seq, path, applied_at}."""
        return await self._run(calls.current_weights(self, model))

    async def declare_weights(
        self, model: str, version: str, backends: list[str], *, owner: str = "trainer"
    ) -> dict[str, Any]:
        """Record that `backends` (a trainer's own servers, updated in place by it) now serve `version` (admin);
        nothing is loaded. {model, version, seq, backends}. ApiError 422 for a version that goes backwards or
        a backend of another model, 404 for a backend that is not registered."""
        return await self._run(calls.declare_weights(self, model, version, backends, owner=owner))

    async def deregister_backend(self, backend_id: str) -> bool:
        """Remove a backend from the pool; False when it was not registered."""
        return await self._run(calls.deregister_backend(self, backend_id))


async def run(http: httpx.AsyncClient, call: steps.Call[T]) -> T:
    """The call's result, its steps awaited one by one."""
    result: list[T] = []
    item: object
    async for item in drive(http, steps.returning(call, result)):
        raise TypeError(f"a call emitted {item!r}: define it as a stream")
    return result[0]


async def drive(http: httpx.AsyncClient, call: steps.Stream[T]) -> AsyncIterator[T]:
    """Await each step the call yields (steps.Resumed) and yield what it emits. The call's open
    stream is closed however it ends."""
    stream = _OpenStream()
    resumed = steps.Resumed(call)
    try:
        for step in resumed:
            if isinstance(step, steps.Emit):
                yield step.item
                continue
            try:
                resumed.reply = await _perform(http, step, stream)
            except Exception as exc:  # noqa: BLE001 - raised in the call, at the step that failed
                resumed.error = exc
    finally:
        await stream.close()
        call.close()


async def _perform(http: httpx.AsyncClient, step: steps.Step, stream: _OpenStream) -> Any:
    if isinstance(step, steps.Send):
        return await http.request(step.method, step.path, **step.options)
    if isinstance(step, steps.Sleep):
        return await asyncio.sleep(step.seconds)
    if isinstance(step, steps.Gather):
        return list(await asyncio.gather(*(run(http, call) for call in step.calls)))
    if isinstance(step, steps.OpenStream):
        return await stream.open(http, step)
    if isinstance(step, steps.NextLine):
        return await stream.next_line()
    if isinstance(step, steps.CloseStream):
        return await stream.close()
    raise TypeError(f"not a step: {step!r}")


class _OpenStream:
    """The one streamed response a call has open, and its lines."""

    def __init__(self) -> None:
        self.exits = AsyncExitStack()
        self.lines: AsyncIterator[str] | None = None

    async def open(self, http: httpx.AsyncClient, step: steps.OpenStream) -> httpx.Response:
        await self.close()
        response = await self.exits.enter_async_context(http.stream(step.method, step.path, **step.options))
        if response.status_code != 200:
            await response.aread()  # the error's body
        self.lines = response.aiter_lines()
        return response

    async def next_line(self) -> str | None:
        if self.lines is None:
            raise RuntimeError("NextLine without an open stream")
        line = await anext(self.lines, None)
        if line is None:
            await self.close()
        return line

    async def close(self) -> None:
        self.lines = None
        await self.exits.aclose()
