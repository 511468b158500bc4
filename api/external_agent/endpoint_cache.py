"""Where each external agent's job is served, remembered by one API process so a call skips Redis.

An entry (job id -> the worker's endpoint URL) is only ever a hint that fails safe:

- it is filled from a Redis lookup that found the job serving, and only while this process is
  subscribed to the jobs' events (api/job_events.py); a lookup that raced an event is not kept (`epoch`);
- the job's events drop it: a cancel (published by `JobStore.cancel`) and a rollout that starts
  serving the job, e.g. on another worker after a restart (published by the rollout stage);
- while the subscription is down nothing is cached and every call looks the job up as before;
- entries older than MAX_AGE_S are dropped, so a missed event is bounded;
- the caller (api/external_agent/forward.py) drops it when the worker cannot be reached, answers 409, or
  does not name the job in its answer (`x-rollouts-job`: another server now holds the address).

The token is always checked by the API before a cached route is used, and by the worker again.
"""

from __future__ import annotations

import time

MAX_AGE_S = 5.0


class EndpointCache:
    """job id -> worker URL, valid while the events subscription (api/job_events.py) is live."""

    def __init__(self, max_age_s: float = MAX_AGE_S) -> None:
        self._max_age_s = max_age_s
        self._routes: dict[str, tuple[str, float]] = {}
        self._live = False
        self._epoch = 0  # bumped by every event and by losing the subscription

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

    def on_event(self, job_id: str, word: str) -> None:
        """A cancel or a new serving worker: a lookup racing it is not kept. Any other end only drops its route."""
        if word in ("cancelled", "serving"):
            self._epoch += 1
        self.drop(job_id)

    def on_live(self, live: bool) -> None:
        """Subscribed: routes may be remembered from now on. Not: forget them all, every call asks Redis."""
        self._live = live
        if not live:
            self._epoch += 1
            self._routes.clear()
