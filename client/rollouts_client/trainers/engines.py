"""The trainer's own vLLM servers in the service's pool: registered, kept alive, labelled with the step, removed.

verl and SkyRL run their own vLLM servers and load new weights into them in place after every
step. In that mode (`engines: trainer`) the bridge registers those servers as backends of the
pool (labels `owner=trainer`, `trainer`, `run_id`: the operator sees whose they are), beats their
heartbeat while the trainer runs, and declares the trainer's step as the model's weight version
whenever it changes (POST /v1/models/{model}/weights/declare: nothing is loaded; every later turn
those servers sample records the version, so `max_staleness` counts steps). It never calls the
service's weight update. `close()` (also at interpreter exit, and on leaving a `with`) deregisters
them; a trainer that crashes leaves them to the pool's heartbeat expiry, which takes them out of
selection after `llm_heartbeat_timeout_s`.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Sequence
from typing import Any

from rollouts_client.registration import Registration, keep_alive
from rollouts_client.sync import RolloutClient
from rollouts_client.trainers.settings import BridgeSettings
from rollouts_client.wire import RetryPolicy

log = logging.getLogger(__name__)


def step_version(step: int) -> str:
    """The weight version a trainer's step is declared as."""
    return f"step-{int(step)}"


def engine_url(address: str) -> str:
    """A server address as trainers list them (`10.0.0.5:8000`, verl's) or a URL, as the base URL to register."""
    address = address.strip().rstrip("/")
    if not address:
        raise ValueError("engine_urls: an empty address")
    if "://" in address:
        return address
    if address.count(":") > 1 and not address.startswith("["):  # a bare IPv6 address with its port
        host, port = address.rsplit(":", 1)
        address = f"[{host}]:{port}"
    return f"http://{address}"


class TrainerEngines:
    """One trainer run's vLLM servers as backends of the pool, for as long as the trainer runs: a
    Registration each (rollouts_client/registration.py), beaten together by one thread."""

    def __init__(
        self,
        urls: Sequence[str],
        model: str,
        *,
        trainer: str,
        run_id: str,
        api_url: str | None = None,
        token: str | None = None,
        heartbeat_s: float = 5.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not urls:
            raise ValueError("engine_urls: at least one server address of the trainer")
        if not model:
            raise ValueError("model: the served model name the trainer's servers answer to (required with engines)")
        if heartbeat_s <= 0:
            raise ValueError("heartbeat_s: positive")
        self.urls = [engine_url(u) for u in urls]
        self.model, self.trainer, self.run_id = model, trainer, run_id
        self.heartbeat_s = heartbeat_s
        self.client = RolloutClient(api_url, token, retry=retry)
        self.registrations: list[Registration] = []
        self.version: str | None = None  # the last one declared
        self.lock = threading.RLock()  # over each heartbeat round and each declaration
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def labels(self) -> dict[str, str]:
        return {"owner": "trainer", "trainer": self.trainer, "run_id": self.run_id}

    @property
    def backend_ids(self) -> list[str]:
        """The registered servers' backend ids, in the order of `urls`."""
        return [r.backend_id for r in self.registrations if r.backend_id is not None]

    def start(self) -> TrainerEngines:
        """Register every server (refused ones raise ApiError: a wrong URL or model is the trainer's to fix)
        and start beating."""
        try:
            for url in self.urls:
                registration = Registration(
                    self.client,
                    {"url": url, "model": self.model, "labels": self.labels},
                    self.heartbeat_s,
                    stopped=self.stopped,
                    lock=self.lock,
                    on_registered=self._redeclare,
                )
                self.registrations.append(registration)
                registration.register()
        except BaseException:
            self.close()  # what was registered before the refusal leaves the pool, and the client is closed
            raise
        self.thread = threading.Thread(
            target=keep_alive,
            args=(self.registrations, self.heartbeat_s, self.stopped),
            name="rollouts-engines-heartbeat",
            daemon=True,
        )
        self.thread.start()
        atexit.register(self.close)
        log.info("registered the trainer's servers %s as backends %s", self.urls, self.backend_ids)
        return self

    def declare(self, step: int | None) -> dict[str, Any] | None:
        """Declare the trainer's step as the servers' weight version when it changed (None: unknown, nothing
        sent). The answer of the service ({model, version, seq, backends}), None when nothing changed."""
        if step is None:
            return None
        version = step_version(step)
        with self.lock:
            if version == self.version:
                return None
            answer = self.client.declare_weights(self.model, version, self.backend_ids, owner=self.run_id)
            self.version = version
        return answer

    def close(self) -> None:
        """Stop beating and deregister every server (what the API cannot be told now, heartbeat expiry ends)."""
        self.stopped.set()
        atexit.unregister(self.close)
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=self.heartbeat_s + 5)
        for registration in self.registrations:
            registration.stop()
        self.client.close()

    def __enter__(self) -> TrainerEngines:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _redeclare(self, backend_id: str) -> None:
        """A server registered again (the pool forgot it: an operator, a wiped Redis) gets the declared version back."""
        if self.version is not None:
            self.client.declare_weights(self.model, self.version, [backend_id], owner=self.run_id)


_running: dict[tuple[object, ...], TrainerEngines] = {}
_running_lock = threading.Lock()


def engines_for(settings: BridgeSettings, trainer: str, discovered: Sequence[str] | None = None) -> TrainerEngines:
    """The process's started TrainerEngines for these settings (one per run and server set, however many bridge
    objects the trainer builds); `discovered`: the addresses the trainer gave, used when the settings name none."""
    urls = settings.engine_urls or (tuple(discovered) if discovered else None)
    if not urls:
        raise ValueError(
            "engine_urls: engines: trainer needs the trainer's server addresses (the setting, "
            "ROLLOUTS_TRAINER_ENGINE_URLS, or a trainer that gives them) and none were given"
        )
    assert settings.model is not None  # BridgeSettings requires it with engines: trainer
    key = (settings.api_url, settings.token, settings.model, settings.run_id, tuple(urls))
    with _running_lock:
        engines = _running.get(key)
        if engines is None or engines.stopped.is_set():
            engines = TrainerEngines(
                urls,
                settings.model,
                trainer=trainer,
                run_id=settings.run_id,
                api_url=settings.api_url,
                token=settings.token,
                heartbeat_s=settings.engine_heartbeat_s,
                retry=settings.retry,
            ).start()
            _running[key] = engines
    return engines
