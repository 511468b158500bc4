"""Long polls of job ids, woken by the jobs' end events rather than a client polling again.

`GET /v1/jobs?ids=...&wait_s=...` registers its ids here before it reads their statuses, so an end
published between the read and the wait still wakes it. While the events subscription is down
(Redis away) a wait lasts at most FALLBACK_S and the route reads Redis again: slower, never stuck.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from api.job_events import listener
from shared.jobs.status import TERMINAL
from shared.jobs.store import JobStore
from shared.jobs.views import job_summaries

FALLBACK_S = 1.0


class JobEndWaits:
    """job id -> the waits that want to hear of its end; a listener of api/job_events.py."""

    def __init__(self) -> None:
        self._waits: dict[str, set[asyncio.Event]] = {}
        self._live = False

    @contextmanager
    def watching(self, job_ids: list[str]) -> Iterator[asyncio.Event]:
        """An event set once any of these jobs ends (or the subscription drops), for the block's duration."""
        event = asyncio.Event()
        for job_id in job_ids:
            self._waits.setdefault(job_id, set()).add(event)
        try:
            yield event
        finally:
            for job_id in job_ids:
                waits = self._waits.get(job_id)
                if waits is not None:
                    waits.discard(event)
                    if not waits:
                        del self._waits[job_id]

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        """Until the event, or the timeout (FALLBACK_S at most while not subscribed)."""
        if not self._live:
            timeout_s = min(timeout_s, FALLBACK_S)
        with suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)

    def on_event(self, job_id: str, word: str) -> None:
        if word in TERMINAL:
            for event in self._waits.get(job_id, ()):
                event.set()

    def on_live(self, live: bool) -> None:
        self._live = live
        if not live:  # whatever was missed: every wait reads Redis again
            for waits in self._waits.values():
                for event in waits:
                    event.set()


async def summaries_once_one_ends(
    request: Request, store: JobStore, job_ids: list[str], wait_s: float
) -> list[dict[str, Any]]:
    """The jobs' summaries, at once if any has ended (or gone) or no wait was asked, else once one ends or
    `wait_s` has passed. Registered before the first read, so an end between read and wait still wakes it."""
    jobs = await run_in_threadpool(job_summaries, store, job_ids)
    if not wait_s or _any_ended(jobs, job_ids):
        return jobs
    deadline = time.monotonic() + wait_s
    waits = _job_end_waits(request)
    with waits.watching(job_ids) as ended:
        while (left := deadline - time.monotonic()) > 0:
            ended.clear()  # before the read: an end published during it still wakes the wait
            jobs = await run_in_threadpool(job_summaries, store, job_ids)
            if _any_ended(jobs, job_ids):
                break
            await waits.wait(ended, left)
    return await run_in_threadpool(job_summaries, store, job_ids) if left <= 0 else jobs


def _any_ended(jobs: list[dict[str, Any]], job_ids: list[str]) -> bool:
    """Some job has ended, or is gone (expired, or never there): a waiting client must hear of it now."""
    return len(jobs) < len(job_ids) or any(job["status"] in TERMINAL for job in jobs)


def _job_end_waits(request: Request) -> JobEndWaits:
    """This process's long polls, listening to the jobs' events (subscribed on first use)."""
    return listener(request, "job_end_waits", JobEndWaits)
