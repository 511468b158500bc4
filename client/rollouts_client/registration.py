"""A backend kept in the service's pool: registered, heartbeat, registered again if forgotten, deregistered at stop.

The one way a process keeps LLM backends in the pool: `rollouts register` beside a vLLM server
(cli/backends.py) and a trainer's own servers (trainers/engines.py). API outages never end it:
a failed registration, heartbeat or re-registration is logged and tried again with exponential
backoff (up to 30 s, or the heartbeat interval if longer) until `stop`; only a refusal of the
first registration (a 4xx: bad token, bad body) is final.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import httpx

from rollouts_client.errors import ApiError, RolloutsClientError
from rollouts_client.sync import RolloutClient

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0


class RegistrationRefused(RolloutsClientError, RuntimeError):
    """The API refused the registration for good (a 4xx: bad token, bad body): trying again cannot help."""


class Registration:
    """Keeps one backend registered with the API.

    `body`: RolloutClient.register_backend's arguments (url, model, backend_id, capacity, labels, ...).
    `stopped` (shared by the registrations of one process that stop together) ends the heartbeats;
    `lock` is held over each heartbeat and re-registration, so what else the owner sends about the
    backend (a declared weight version) sees its current id; `on_registered(backend_id)` runs, under
    it, after a re-registration (to give the new registration what the old one had).
    """

    def __init__(
        self,
        client: RolloutClient,
        body: dict[str, Any],
        interval_s: float,
        *,
        stopped: threading.Event | None = None,
        lock: AbstractContextManager[object] | None = None,
        on_registered: Callable[[str], object] | None = None,
    ) -> None:
        self.client = client
        self.body = body
        self.interval_s = interval_s
        self.backend_id: str | None = None
        self.stopped = stopped or threading.Event()
        self.lock = lock or threading.RLock()
        self.on_registered = on_registered

    def register(self) -> str:
        """One registration; ApiError or httpx's error as raised."""
        self.backend_id = str(self.client.register_backend(**self.body)["id"])
        return self.backend_id

    def register_until_done(self) -> str | None:
        """Register, riding out API outages with backoff; None if stopped first. A 4xx is RegistrationRefused."""
        failures = 0
        while not self.stopped.is_set():
            try:
                backend_id = self.register()
            except (ApiError, httpx.HTTPError) as exc:
                if isinstance(exc, ApiError) and exc.status_code < 500:
                    raise RegistrationRefused(
                        f"registration refused ({exc.status_code}): {str(exc.detail)[:500]}"
                    ) from None
                failures += 1
                delay = self._backoff(failures)
                log.warning("registration failed (%s); retrying in %.1fs", exc, delay)
                self.stopped.wait(delay)
                continue
            if self.stopped.is_set():  # stopped while the request was in flight: do not linger
                self._deregister()
                return None
            return backend_id
        return None

    def beat(self) -> bool:
        """One heartbeat; registers again if the API forgot the backend. False: the API did not take it."""
        assert self.backend_id is not None
        with self.lock:
            try:
                self.client.backend_heartbeat(self.backend_id)
                return True
            except ApiError as exc:
                if exc.status_code != 404:
                    detail = str(exc.detail)[:200]
                    log.warning("heartbeat of backend %s answered %s: %s", self.backend_id, exc.status_code, detail)
                    return False
            log.warning("backend %s was forgotten by the API; registering it again", self.backend_id)
            backend_id = self.register()
            if self.on_registered is not None:
                self.on_registered(backend_id)
            return True

    def run(self) -> None:
        """Heartbeat until stopped; API outages are logged and ridden out with backoff, never fatal."""
        keep_alive([self], self.interval_s, self.stopped)

    def stop(self) -> str | None:
        """Stop beating and deregister; returns the id deregistered (None: none was, or the API was away)."""
        self.stopped.set()
        return self._deregister()

    def _deregister(self) -> str | None:
        with self.lock:
            backend_id, self.backend_id = self.backend_id, None
        if backend_id is None:
            return None
        try:
            removed = self.client.deregister_backend(backend_id)
            log.info("deregistered %s%s", backend_id, "" if removed else " (the pool had already dropped it)")
        except (httpx.HTTPError, ApiError) as exc:
            log.warning("backend %s not deregistered (the pool drops it after missed heartbeats): %s", backend_id, exc)
            return None
        return backend_id

    def _backoff(self, failures: int) -> float:
        return backoff(self.interval_s, failures)


def backoff(interval_s: float, failures: int) -> float:
    """The wait after `failures` failures in a row: doubling from the interval, capped."""
    return min(interval_s * 2 ** min(failures, 16), max(MAX_BACKOFF_S, interval_s))


def keep_alive(registrations: Sequence[Registration], interval_s: float, stopped: threading.Event) -> None:
    """Heartbeat every registration each `interval_s` until `stopped`; while the API fails, back off."""
    failures = 0
    while not stopped.wait(backoff(interval_s, failures) if failures else interval_s):
        ok = True
        for registration in registrations:
            try:
                ok = registration.beat() and ok
            except (httpx.HTTPError, ApiError) as exc:
                log.warning("heartbeat of backend %s failed: %s", registration.backend_id, exc)
                ok = False
        failures = 0 if ok else failures + 1
