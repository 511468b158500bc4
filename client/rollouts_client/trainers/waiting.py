"""Submitting jobs and waiting for them, shared by every row a trainer process runs at once.

One waiter per event loop follows *all* the jobs its callers wait on with one watch (the client's
`watch_jobs`, the one way to wait for jobs: a long poll the service answers as soon as one of them
ends), so an end is seen when it happens and a trainer with 512 rows in flight holds one request,
not 512. A row that joins (or gives up: its wait timed out) cuts the watch short and a new one
starts with every pending job (the rows joining in the same turn of the loop are asked for together). A job that ends resolves its
callers' futures; its full record is then read once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import weakref
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from rollouts_client.aio import AsyncRolloutClient
from rollouts_client.errors import ApiError, WaitTimeout
from rollouts_client.models import Job, JobsProgress
from rollouts_client.trainers.records import FAILED, JobFailed, input_error
from rollouts_client.trainers.rows import RowError
from rollouts_client.trainers.settings import BridgeSettings

LONG_POLL_S = 20.0  # one long poll's wait; a row that joins cuts it short

# How the API names a field of the n-th job of a list: body[3].task.kind
_LISTED_FIELD = re.compile(r"^body\[(\d+)\](.*)$")


class JobWaiter:
    """Futures for job ids, resolved by one task that follows them all with the client's watch_jobs."""

    def __init__(self, client: AsyncRolloutClient, poll_min_s: float, poll_max_s: float) -> None:
        self.client = client
        self.poll_min_s, self.poll_max_s = poll_min_s, poll_max_s
        self.pending: dict[str, list[asyncio.Future[Job]]] = {}
        self.task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()  # the pending jobs are not those the running watch follows
        self.fetching: set[str] = set()  # ended, their records being read: not watched again
        self.fetches: set[asyncio.Future[None]] = set()  # those reads (kept from the GC)

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """The job's full record once it is terminal; WaitTimeout past `timeout` (the job goes on)."""
        future: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        if job_id not in self.pending:
            self.changed.set()
        self.pending.setdefault(job_id, []).append(future)
        self._follow_soon()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise WaitTimeout(f"job {job_id} still running after {timeout}s") from None
        finally:
            waiters = self.pending.get(job_id)
            if waiters and future in waiters:
                waiters.remove(future)
                if not waiters:  # given up (timed out, cancelled): the watch need not follow it
                    del self.pending[job_id]
                    self.changed.set()

    def _follow_soon(self) -> None:
        """Start the task that watches the pending jobs, unless it runs."""
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        """Watch every pending job whose record is not being read, afresh whenever they change, until none is left."""
        while ids := [j for j in self.pending if j not in self.fetching]:
            self.changed.clear()
            try:
                await self._watch_until_changed(ids)
            except Exception as exc:  # noqa: BLE001 - the client retried with backoff: every waiter gets the error
                for job_id in list(self.pending):
                    self._settle(job_id, error=exc)
                return
            await asyncio.sleep(0)  # the rows joining in this turn of the loop are asked for together

    async def _watch_until_changed(self, ids: list[str]) -> None:
        """Follow `ids` until each has ended (its record then read beside the watch) or the pending jobs change."""
        watch = self.client.watch_jobs(ids, poll_s=self.poll_min_s, max_poll_s=self.poll_max_s, update_s=LONG_POLL_S)
        try:
            while (progress := await self._next_unless_changed(watch)) is not None:
                for job_id in [*(job.id for job in progress.ended), *progress.unlisted]:
                    self.fetching.add(job_id)
                    self.fetches.add(task := asyncio.ensure_future(self._fetch(job_id)))
                    task.add_done_callback(self.fetches.discard)
        finally:
            await watch.aclose()

    async def _next_unless_changed(self, watch: AsyncIterator[JobsProgress]) -> JobsProgress | None:
        """The watch's next answer; None at its end, or when the pending jobs changed first (its request cancelled)."""
        answer = asyncio.ensure_future(anext(watch, None))
        changed = asyncio.ensure_future(self.changed.wait())
        try:
            await asyncio.wait({answer, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (answer, changed):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        return answer.result() if answer.done() and not answer.cancelled() else None

    async def _fetch(self, job_id: str) -> None:
        """Read an ended job's record and resolve its waiters; one not ended after all is watched again."""
        try:
            job = await self.client.get_job(job_id)
        except Exception as exc:  # noqa: BLE001 - the client retried: this job's waiters get the error
            self._settle(job_id, error=exc)
        else:
            if job.finished:
                self._settle(job_id, job=job)
        finally:
            self.fetching.discard(job_id)
            if job_id in self.pending:  # not ended after all (a summary ahead of its record): watch it again
                self.changed.set()
                self._follow_soon()

    def _settle(self, job_id: str, job: Job | None = None, error: BaseException | None = None) -> None:
        for future in self.pending.pop(job_id, []):
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(job)


class ServiceConnection:
    """A client and its waiter for one event loop (a trainer builds a new bridge object per row)."""

    # Per event loop (an httpx client belongs to the loop it ran on), per settings; gone with the loop.
    _by_loop: ClassVar[
        weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[BridgeSettings, ServiceConnection]]
    ] = weakref.WeakKeyDictionary()

    def __init__(self, settings: BridgeSettings) -> None:
        self.settings = settings
        self.client = AsyncRolloutClient(settings.api_url, settings.token, retry=settings.retry)
        self.waiter = JobWaiter(self.client, settings.poll_min_s, settings.poll_max_s)

    @classmethod
    def shared(cls, settings: BridgeSettings) -> ServiceConnection:
        connections = cls._by_loop.setdefault(asyncio.get_running_loop(), {})
        if settings not in connections:
            connections[settings] = cls(settings)
        return connections[settings]

    async def run_jobs(self, bodies: list[dict[str, Any]], keys: list[str], rows: list[str]) -> list[tuple[Job, int]]:
        """Submit every job in one request (each under its key, so a repeat finds it), wait for each as it ends,
        and resubmit or raise the failed ones (JobFailed naming the row; one whose input cannot run, such as a
        prompt over `limits.max_prompt_tokens`, at once); the done jobs and the attempts each took, in the order given.

        A 422 is a row's fault: RowError names the row and the service's field. Attempt k > 1 of a row
        is keyed `<key>.r<k>`: a new job, since the failed one keeps its key.
        """
        ids = await self.submit(bodies, keys, rows)
        return list(await asyncio.gather(*(self.settle(b, k, r, i) for b, k, r, i in zip(bodies, keys, rows, ids))))

    async def run_job(self, body: dict[str, Any], key: str, row: str) -> tuple[Job, int]:
        """One job, as run_jobs."""
        [result] = await self.run_jobs([body], [key], [row])
        return result

    async def submit(self, bodies: list[dict[str, Any]], keys: list[str], rows: list[str]) -> list[str]:
        """Submit the jobs in one request, each under its key; their ids (RowError naming the row on a 422)."""
        jobs = [{**body, "idempotency_key": key} for body, key in zip(bodies, keys)]
        try:
            return await self.client.submit_jobs(jobs if len(jobs) > 1 else jobs[0])
        except ApiError as exc:
            if exc.status_code != 422:
                raise
            first = (exc.errors or [{"field": "body", "message": str(exc.detail)}])[0]
            field, index = str(first.get("field", "body")), 0
            listed = _LISTED_FIELD.match(field)
            if listed and int(listed[1]) < len(rows):  # body[3].task.kind -> row 3's body.task.kind
                field, index = f"body{listed[2]}", int(listed[1])
            raise RowError(rows[index], field, str(first.get("message", exc.detail))) from exc

    async def settle(self, body: dict[str, Any], key: str, row: str, job_id: str) -> tuple[Job, int]:
        """Wait for a submitted job; resubmit it on failure or raise JobFailed (run_jobs' rules); (job, attempts)."""
        attempts = self.settings.max_attempts if self.settings.on_failure == "retry" else 1
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                [job_id] = await self.submit([body], [f"{key}.r{attempt}"], [row])
            job = await self.waiter.wait(job_id, self.settings.wait_timeout_s)
            if job.status not in FAILED:
                return job, attempt
            if input_error(job):  # prompt_too_long, ...: it would fail again
                raise JobFailed(job, attempt, row)
        raise JobFailed(job, attempts, row)
