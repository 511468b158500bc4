"""Where each external agent's job is served, remembered by one API process so a call skips Redis.

An entry (job id -> the worker's endpoint URL) is only ever a hint that fails safe:

- it is filled from a Redis lookup that found the job serving, and only while this process is
  subscribed to the jobs' events channel; a lookup that raced an event is not kept (`epoch`);
- the job's events drop it: a cancel (published by `JobStore.cancel`) and a rollout that starts
  serving the job, e.g. on another worker after a restart (published by the rollout stage);
- while the subscription is down nothing is cached and every call looks the job up as before;
- entries older than MAX_AGE_S are dropped, so a missed event is bounded;
- the caller (api/routes/agent.py) drops it when the worker cannot be reached, answers 409, or
  does not name the job in its answer (`x-rollouts-job`: another server now holds the address).

The credential is always checked by the API before a cached route is used, and by the worker again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

MAX_AGE_S = 5.0
RESUBSCRIBE_S = 1.0


class RouteCache:
    """job id -> worker URL, valid while the events subscription is live."""

    def __init__(self, redis: AsyncRedis, channel: str, max_age_s: float = MAX_AGE_S) -> None:
        self._redis = redis
        self._channel = channel
        self._max_age_s = max_age_s
        self._routes: dict[str, tuple[str, float]] = {}
        self._live = False
        self._epoch = 0  # bumped by every event and by losing the subscription
        self._task: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        return self._live

    @property
    def epoch(self) -> int:
        """Read before a lookup; `put` keeps the lookup's answer only if no event came in between."""
        return self._epoch

    def get(self, job_id: str) -> str | None:
        entry = self._routes.get(job_id)
        if entry is None or not self._live:
            return None
        if time.monotonic() - entry[1] > self._max_age_s:
            self._routes.pop(job_id, None)
            return None
        return entry[0]

    def put(self, job_id: str, url: str, epoch: int) -> None:
        if self._live and epoch == self._epoch:
            self._routes[job_id] = (url, time.monotonic())

    def drop(self, job_id: str) -> None:
        self._routes.pop(job_id, None)

    def start(self) -> None:
        """Subscribe in the background (on the running loop); until subscribed nothing is cached."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        self._disable()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def _disable(self) -> None:
        self._live = False
        self._epoch += 1
        self._routes.clear()

    def _on_event(self, data: bytes | str) -> None:
        text = data.decode() if isinstance(data, bytes) else data
        self._epoch += 1
        self.drop(text.partition(" ")[0])

    async def _listen(self) -> None:
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                self._live = True
                while True:
                    message = await pubsub.get_message(timeout=0.2)
                    if message is not None and message.get("type") == "message":
                        self._on_event(message["data"])
                    elif pubsub.connection is None:  # the connection went away without an error
                        raise ConnectionError("events subscription closed")
            except (RedisError, OSError) as exc:  # Redis away: serve from Redis lookups until subscribed again
                log.warning("agent route cache off, the events subscription failed (%s); retrying", exc)
                self._disable()
                await asyncio.sleep(RESUBSCRIBE_S)
            finally:  # anything else ends the task: nothing is remembered again, every call asks Redis
                self._disable()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
