"""Long polls of job ids, woken by the jobs' end events rather than a client polling again.

`GET /v1/jobs?ids=...&wait_s=...` registers its ids here before it reads their statuses, so an end
published between the read and the wait still wakes it. While the events subscription is down
(Redis away) a wait lasts at most FALLBACK_S and the route reads Redis again: slower, never stuck.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from shared.jobs.status import TERMINAL

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
