"""One subscription per API process to the jobs' pub/sub channels, shared by whoever reacts to them.

Two listeners use it: the external agents' endpoint cache (api/external_agent/endpoint_cache.py drops a route
on a cancel or a new serving worker) and the job-end waits (api/jobs/long_poll.py wakes the long
polls of `GET /v1/jobs?ids=...&wait_s=...`). Each event is "<job id> <status or word>". While the
subscription is down every listener is told (`on_live(False)`) and falls back to reading Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from fastapi import Request
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError

from shared.redis_conn import connect_for_requests_async

log = logging.getLogger(__name__)

RESUBSCRIBE_S = 1.0

L = TypeVar("L", bound="Listener")


class Listener(Protocol):
    def on_event(self, job_id: str, word: str) -> None: ...

    def on_live(self, live: bool) -> None: ...


class JobEvents:
    """Subscribes in the background on the running loop; tells its listeners each event and each change of state."""

    def __init__(self, redis: AsyncRedis, channels: list[str]) -> None:
        self._redis = redis
        self._channels = channels
        self._listeners: list[Listener] = []
        self._live = False
        self._task: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        return self._live

    def add(self, listener: Listener) -> None:
        self._listeners.append(listener)
        listener.on_live(self._live)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        self._set_live(False)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def _set_live(self, live: bool) -> None:
        self._live = live
        for listener in self._listeners:
            listener.on_live(live)

    def _dispatch(self, data: bytes | str) -> None:
        text = data.decode() if isinstance(data, bytes) else data
        job_id, _, word = text.partition(" ")
        for listener in self._listeners:
            listener.on_event(job_id, word)

    async def _listen(self) -> None:
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._channels)
                self._set_live(True)
                while True:
                    message = await pubsub.get_message(timeout=0.2)
                    if message is not None and message.get("type") == "message":
                        self._dispatch(message["data"])
                    elif pubsub.connection is None:  # the connection went away without an error
                        raise ConnectionError("events subscription closed")
            except (RedisError, OSError) as exc:  # Redis away: listeners read Redis until subscribed again
                log.warning("job events subscription failed (%s); retrying", exc)
                self._set_live(False)
                await asyncio.sleep(RESUBSCRIBE_S)
            finally:  # anything else ends the task: listeners stay on their fallback
                self._set_live(False)
                with contextlib.suppress(Exception):
                    await pubsub.aclose()


def fail_fast_redis(request: Request) -> AsyncRedis:
    """The app's redis.asyncio client for the hot path (fail-fast timeouts), made on first use."""
    state = request.app.state
    if getattr(state, "fail_fast_async_redis", None) is None:
        state.fail_fast_async_redis = connect_for_requests_async(state.settings)
    redis: AsyncRedis = state.fail_fast_async_redis
    return redis


def job_events(request: Request) -> JobEvents:
    """This process's subscription to the jobs' channels (cancels and serving; other job ends), started on first use."""
    state = request.app.state
    events: JobEvents | None = getattr(state, "job_events", None)
    if events is None:
        events = state.job_events = JobEvents(fail_fast_redis(request), [state.keys.job_events, state.keys.job_ends])
        events.start()
    return events


def listener(request: Request, name: str, make: Callable[[], L]) -> L:
    """This process's listener kept as `app.state.<name>`: made, and added to the job events, on first use."""
    state = request.app.state
    found: L | None = getattr(state, name, None)
    if found is None:
        found = make()
        setattr(state, name, found)
        job_events(request).add(found)
    return found
