"""The whole service on one machine: Redis (embedded if none is configured), the API, LLM backends, workers.

`rollouts up` and `rollouts run` use it, and so do the end-to-end tests, so the
tests start the stack exactly the way a user does: real processes, each
configured only through ROLLOUTS_* environment variables. The LLM backend is a real
vLLM server (`cli/vllm_server.py`), registered with the pool the way an operator does it:
a `rollouts register` process beside it that heartbeats and deregisters on SIGTERM.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

from cli.connect import is_loopback
from cli.embedded_redis import EmbeddedRedis, free_port
from cli.hang_watch import HangWatch
from cli.stack_children import ChildProcesses, signal_group, terminate
from cli.stack_errors import StackError
from cli.stack_registrars import Registrars
from cli.stack_restart_counts import RestartCounts
from cli.stack_weights import load_current_weights
from cli.supervision import RestartPolicy, StayDown, Supervised
from cli.tiny_model import tiny_model_dir
from cli.vllm_server import VLLMError, VLLMServer
from rollouts_client import ApiError, RetryPolicy, RolloutClient
from shared.config import STAGES, Settings
from shared.redis_conn import write_url_file

Process = Callable[[], "subprocess.Popen[bytes] | None"]  # a supervised unit's process now (None: none to watch)


class Stack:
    """The stack's configuration, its start order (Redis, the API, backends, workers), supervision and stop order."""

    def __init__(
        self,
        settings: Settings,
        *,
        api_port: int | None = None,
        concurrency: dict[str, int] | None = None,
        workers_per_stage: int = 1,
        log_dir: Path | None = None,
        persistent_redis: bool = False,
        vllm: bool = False,
        model: Path | None = None,
        backend_urls: list[str] | None = None,
        on_progress: Callable[[str], None] | None = None,
        extra_env: dict[str, str] | None = None,
        drain_timeout_s: float | None = None,
        register_as: str | None = None,
    ) -> None:
        self.settings = settings
        self.api_port = api_port if api_port is not None else settings.api_port
        self.concurrency = concurrency or {}
        self.workers_per_stage = workers_per_stage
        self.log_dir = log_dir
        self.persistent_redis = persistent_redis
        self.vllm = vllm
        self.model = model or settings.vllm_model
        self.backend_urls = backend_urls or []
        self.on_progress = on_progress or (lambda message: None)
        self.extra_env = dict(extra_env or {})
        # Listening beyond loopback (remote workers and trainers): a backend on this machine's loopback is
        # registered behind a node gateway on the API's address, as on a cluster (gateway/), with keys
        # made for this stack unless the settings have them.
        gateway_host = None if is_loopback(settings.api_host) else settings.api_host
        if gateway_host is not None:
            for name, value in (
                ("ROLLOUTS_BACKEND_TOKEN", settings.backend_token),
                ("ROLLOUTS_BACKEND_ADMIN_TOKEN", settings.backend_admin_token),
            ):
                if not value:
                    self.extra_env.setdefault(name, secrets.token_urlsafe(32))
        self.drain_timeout_s = drain_timeout_s  # the workers' time to finish on stop; None: their setting
        # The model name the stack's vLLM is registered under: its served name, or a LoRA adapter it
        # serves (`--lora-modules NAME=DIR` in vllm_args), so that every job samples from the adapter.
        self.register_as = register_as
        self.redis: EmbeddedRedis | None = None
        self.redis_url = settings.redis_url
        self.redis_url_file: Path | None = None  # set when the stack starts its own Redis
        self.api: subprocess.Popen[bytes] | None = None
        self.vllm_server: VLLMServer | None = None
        self._vllm_slot: int | None = None  # the index in `registrars` of the stack's vLLM's registrar
        self._vllm_out = False  # the stack's vLLM is out of the pool (dead, restarting, or down for good)
        self.workers: dict[str, list[subprocess.Popen[bytes]]] = {stage: [] for stage in STAGES}
        # Restarts run on threads of their own: what they start is taken under the lock, never after stop().
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._children = ChildProcesses(log_dir, lambda: self.env, self._stopping)
        self._registration = Registrars(gateway_host, settings.llm_probe_timeout_s, self._spawn, self._lock)
        self.registrars = self._registration.processes  # each registered backend's `rollouts register`
        self._restarts = RestartCounts(self._redis_settings, self._lock)  # for `rollouts status`

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.api_port}"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        if self.redis_url_file is not None:
            env["ROLLOUTS_REDIS_URL"] = ""
            env["ROLLOUTS_REDIS_URL_FILE"] = str(self.redis_url_file)
        else:
            env["ROLLOUTS_REDIS_URL"] = self.redis_url or ""
        env["ROLLOUTS_API_PORT"] = str(self.api_port)
        env["ROLLOUTS_API_URL"] = self.api_url
        env["ROLLOUTS_STATE_DIR"] = str(self.settings.state_dir)
        return env

    # --- start ------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> Stack:
        try:
            if not self.redis_url:
                self.start_redis()
            if self.api_port == 0:
                self.api_port = free_port()
            self.start_api()
            self._wait_for_api(timeout)
            self._restarts.reset()
            if self.vllm:
                self.start_vllm()
            for url in self.backend_urls:
                self.register_backend(url)
            # Workers only once this stack's own backends are in the pool: a backend left registered
            # by an earlier run (in a persistent Redis) may be dead, and jobs handed back by that run
            # would be taken at once.
            self._wait_for_backends(self._own_backend_urls(), timeout=60.0)
            for stage in STAGES:
                for _ in range(self.workers_per_stage):
                    self.start_worker(stage)
        except BaseException:
            self.stop()
            raise
        return self

    def start_redis(self) -> EmbeddedRedis:
        """The embedded Redis: loopback only, a random password, its URL in a 0600 file that the
        stack's processes read (ROLLOUTS_REDIS_URL_FILE), never in their argv or environment."""
        data_dir = self.settings.state_dir / "redis" if self.persistent_redis else None
        password = secrets.token_urlsafe(32)
        self.redis = EmbeddedRedis(
            data_dir=data_dir,
            appendonly=self.persistent_redis,
            password=password,
            maxmemory=self.settings.redis_maxmemory(),
        ).start()
        self.redis_url = self.redis.url
        self.redis_url_file = self.settings.state_dir / "redis.url"
        write_url_file(self.redis_url_file, self.redis_url)
        return self.redis

    def start_api(self) -> subprocess.Popen[bytes]:
        self.api = self._spawn("api", [sys.executable, "-m", "cli", "api", "--port", str(self.api_port)])
        return self.api

    def start_vllm(self) -> VLLMServer:
        """The embedded default's LLM: a vLLM server on `model` (default: the tiny model, built offline)."""
        model, args = self.model, []
        if model is None:
            s = self.settings
            model = tiny_model_dir(s.state_dir, s.tiny_model_seed, s.tiny_model_max_len)
            args = ["--dtype", "float32"]  # tiny and trained in float32: vLLM would otherwise use bf16 on a CPU
        log_path = (self.log_dir or self.settings.state_dir / "logs") / "vllm.log"
        try:
            self.vllm_server = VLLMServer.from_settings(
                self.settings, Path(model), free_port(), log_path=log_path, args=args
            )
            self.on_progress(f"starting vLLM on {model} (log: {log_path})")
            self.vllm_server.start()
            self.vllm_server.wait_until_ready(self.settings.vllm_start_timeout_s, self.on_progress)
        except VLLMError as exc:
            raise StackError(str(exc)) from None
        self.on_progress(f"vLLM ready at {self.vllm_server.url}, serving {self.vllm_server.served_name}")
        self._register_vllm(self.vllm_server)
        return self.vllm_server

    def _vllm_model_name(self, server: VLLMServer) -> str:
        """The model the stack's vLLM is registered as (and its weights are versioned under)."""
        return self.register_as or server.served_name

    def _register_vllm(self, server: VLLMServer) -> None:
        """Its registrar, in the slot of the one before it when it comes back from a restart."""
        # An adapter has no tokenizer of its own: it is the base model's.
        tokenizer = None if self.register_as is None else server.model
        self.register_backend(server.url, self._vllm_model_name(server), tokenizer=tokenizer, slot=self._vllm_slot)
        if self._vllm_slot is None:
            self._vllm_slot = len(self.registrars) - 1

    def register_backend(
        self, url: str, model: str | None = None, tokenizer: Path | None = None, slot: int | None = None
    ) -> subprocess.Popen[bytes]:
        """Register a running server with the pool as an operator does: `rollouts register` beside it.
        `slot`: replace that registrar (one that has exited) instead of adding one."""
        return self._registration.register(url, model, tokenizer, slot)

    def _own_backend_urls(self) -> set[str]:
        urls = [*self.backend_urls, *([self.vllm_server.url] if self.vllm_server is not None else [])]
        return {self.registered_url(url) for url in urls}

    def registered_url(self, url: str) -> str:
        """The URL the pool knows a backend of this stack by: its gateway's, when it has one."""
        return self._registration.registered_url(url)

    def _wait_for_backends(self, urls: set[str], timeout: float) -> None:
        """Until every one of `urls` is registered, healthy and open to new pins."""
        if urls:
            with self._probe(2.0) as api:
                self._registration.wait_until_open(api, urls, timeout)

    def _probe(self, timeout: float, token: str | None = None) -> RolloutClient:
        """A client for readiness checks: no retries (the callers poll); the stack's token unless given."""
        token = token or self.settings.token or next(iter(self.settings.api_tokens), None)
        return RolloutClient(self.api_url, token, timeout=timeout, retry=RetryPolicy(retries=0))

    def start_worker(self, stage: str, concurrency: int | None = None) -> subprocess.Popen[bytes]:
        with self._lock:
            process = self._spawn_worker(stage, len(self.workers[stage]), concurrency)
            self.workers[stage].append(process)
        return process

    def _spawn_worker(self, stage: str, index: int, concurrency: int | None = None) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", f"workers.{stage}"]
        slots = concurrency or self.concurrency.get(stage)
        if slots:
            argv += ["--concurrency", str(slots)]
        if self.drain_timeout_s is not None:
            argv += ["--drain-timeout", str(self.drain_timeout_s)]
        return self._spawn(f"{stage}-{index}", argv)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        return self._children.spawn(name, argv)

    def _wait_for_api(self, timeout: float, healthy: bool = True) -> None:
        """Until the API answers /healthz: 200 (`healthy`), or at all. A restart waits only for it to serve:
        Redis may be down at the same moment, and its restart comes from the same supervising thread."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.api_url, timeout=1.0) as http:
            while time.monotonic() < deadline:
                if self.api is not None and self.api.poll() is not None:
                    raise StackError(f"the API exited with code {self.api.returncode} (port {self.api_port} taken?)")
                try:
                    status = http.get("/healthz").status_code
                except httpx.TransportError:
                    status = None
                if status == 200 or (status is not None and not healthy):
                    return
                time.sleep(0.1)
        raise StackError(f"the API did not {'become healthy' if healthy else 'answer'} within {timeout:.0f}s")

    def wait_for_workers(self, timeout: float = 30.0, token: str | None = None) -> None:
        """Block until every started worker process has registered its slots with rq (asking with `token`)."""
        deadline = time.monotonic() + timeout
        with self._probe(2.0, token) as api:
            while time.monotonic() < deadline:
                try:
                    stages = api.status()["stages"]
                    if all(stages[s]["processes"] >= len(self.workers[s]) for s in STAGES):
                        return
                except (httpx.HTTPError, ApiError, KeyError, ValueError):
                    pass
                time.sleep(0.1)
        raise StackError(f"workers did not register within {timeout:.0f}s")

    # --- run and stop -----------------------------------------------------
    def children(self) -> list[subprocess.Popen[bytes]]:
        others = [p for p in (self.api, self.vllm_server.process if self.vllm_server else None) if p is not None]
        return [p for procs in self.workers.values() for p in procs] + self.registrars + others

    def wait(self) -> int:
        """Block until a child exits; returns its exit code."""
        while True:
            for child in self.children():
                code = child.poll()
                if code is not None:
                    return code
            time.sleep(0.5)

    def supervise(self) -> None:
        """Keep the stack up until stop(): every process it started that dies is started again.

        A dead worker's jobs were handed back or are re-queued by rq's abandoned-job handling; the API
        comes back on its port (clients retry); the embedded Redis on its port, password and data
        directory (with `persistent_redis` its append-only file: nothing lost); a registrar registers
        again. The stack's vLLM leaves the pool at once and comes back with the model's current weights
        (`_restart_vllm`), within a budget (Settings.vllm_restart_budget). One policy for all
        (cli/supervision.py); one log line per death and per restart."""
        units = self._supervised()
        while not self._stopping.is_set():
            now = time.monotonic()
            for unit in units:
                unit.check(now)
            self._restarts.save()
            self._stopping.wait(0.5)

    def _supervised(self) -> list[Supervised]:
        """One supervised unit per process the stack started, each restarted its own way."""
        policy = RestartPolicy()

        def unit(name: str, process: Process, kind: str, restart: Callable[[], str]) -> Supervised:
            return Supervised(name, process, self._restarts.counted(kind, restart), policy, self.on_progress)

        units = [
            unit(
                f"worker {stage}-{index}",
                lambda procs=self.workers[stage], index=index: procs[index],
                "worker",
                lambda stage=stage, index=index: self._restart_worker(stage, index),
            )
            for stage in STAGES
            for index in range(len(self.workers[stage]))
        ]
        if self.api is not None:
            units.append(unit(f"the API (port {self.api_port})", lambda: self.api, "api", self._restart_api))
        if self.redis is not None:
            name = f"the embedded Redis (port {self.redis.port})"
            units.append(unit(name, lambda: self.redis.process if self.redis else None, "redis", self._restart_redis))
        for slot in range(len(self.registrars)):
            if slot != self._vllm_slot:
                restart = partial(self._restart_registrar, slot)
                units.append(unit(f"registrar {slot}", lambda slot=slot: self.registrars[slot], "registrar", restart))
        if self.vllm_server is not None:
            units.append(self._supervised_vllm(self.vllm_server))
            restart = partial(self._restart_registrar, self._vllm_slot)
            units.append(unit("vLLM's registrar", self._vllm_registrar, "registrar", restart))
        return units

    def _supervised_vllm(self, server: VLLMServer) -> Supervised:
        """The stack's vLLM: its own restart budget, a hang watch, out of the pool while it restarts."""
        s = self.settings
        watch = HangWatch(server.url, s.vllm_hang_timeout_s, self._stopping)
        if s.vllm_hang_timeout_s > 0:
            watch.start()
        return Supervised(
            f"vLLM (port {server.port})",
            lambda: self.vllm_server.process if self.vllm_server else None,
            self._restarts.counted("vllm", self._restart_vllm),
            RestartPolicy(budget=s.vllm_restart_budget, window_s=s.vllm_restart_window_s),
            self.on_progress,
            on_death=self._vllm_died,
            threaded=True,
            on_restarted=lambda: self._vllm_rejoins(watch),
            hung=watch.hung,
            kill=lambda process: signal_group(process, signal.SIGKILL),
        )

    def _restart_worker(self, stage: str, index: int) -> str:
        with self._lock:
            self.workers[stage][index] = self._spawn_worker(stage, index)
            return f"pid {self.workers[stage][index].pid}"

    def _restart_api(self) -> str:
        with self._lock:
            self.start_api()
        try:
            self._wait_for_api(60.0, healthy=False)  # on the same port: the clients and workers reach it where they did
        except StackError:
            terminate([self.api] if self.api else [], 10.0)  # never left holding the port for the next try
            raise
        return f"pid {self.api.pid}" if self.api else ""

    def _restart_redis(self) -> str:
        """The same port, password and data directory (and append-only file), so every client reconnects."""
        assert self.redis is not None
        with self._lock:
            self.redis.start()  # it waits until the server answers PING
            return f"pid {self.redis.process.pid}" if self.redis.process else ""

    def _restart_registrar(self, slot: int | None) -> str:
        assert slot is not None
        return f"pid {self._registration.respawn(slot).pid}"

    def _vllm_registrar(self) -> subprocess.Popen[bytes] | None:
        """Its registrar, unless the vLLM it registers is out (the restart registers it again)."""
        return None if self._vllm_out or self._vllm_slot is None else self.registrars[self._vllm_slot]

    def _vllm_died(self) -> None:
        """At once, before the pause: its registrar deregisters it (SIGTERM), so no new turn is routed
        to it; turns in flight there fail over or wait for a backend (`backend_wait_s`) as they always do."""
        self._vllm_out = True
        if self._vllm_slot is not None and self.registrars[self._vllm_slot].poll() is None:
            self.registrars[self._vllm_slot].send_signal(signal.SIGTERM)

    def _restart_vllm(self) -> str:
        """On the same port, and back in the pool only with the model's current weights: a restarted vLLM
        loads the model from disk, and would otherwise serve an old policy under the current version."""
        server = self.vllm_server
        assert server is not None and self._vllm_slot is not None
        terminate([self.registrars[self._vllm_slot]], 15.0)  # deregistered before anything else
        with self._lock:
            if self._stopping.is_set():
                raise StayDown("the stack is stopping")
            server.stop()
            server.start()
        server.wait_until_ready(self.settings.vllm_start_timeout_s, self.on_progress)
        version = load_current_weights(server, self._vllm_model_name(server), self._redis_settings())
        return f"{server.url}, registering again, weights: {version or 'as started (no update applied)'}"

    def _vllm_rejoins(self, watch: HangWatch) -> None:
        """Its registrar again, spawned on the supervising thread (die_with_parent arms only there)."""
        assert self.vllm_server is not None
        watch.restarted()
        with self._lock:
            self._register_vllm(self.vllm_server)
            self._vllm_out = False

    def _redis_settings(self) -> Settings:
        """The settings with the Redis the stack's processes use (its own, when it started one)."""
        return self.settings.model_copy(update={"redis_url": self.redis_url})

    def stop(self, timeout: float = 40.0) -> None:
        """Stop in order: the workers (their running jobs handed back through Redis), then the
        registrars (they deregister through the API) and the backend, the API, and Redis last.
        Supervision ends first: no process is restarted from here on."""
        self._stopping.set()
        with self._lock:
            self._stop_in_order(timeout)

    def _stop_in_order(self, timeout: float) -> None:
        workers = [p for procs in self.workers.values() for p in procs]
        terminate(workers, timeout)
        # The registrars (they deregister on SIGTERM, so the API must still be up) and the backend
        # stop side by side: with the workers gone nobody calls the backend any more.
        for registrar in self.registrars:
            if registrar.poll() is None:
                registrar.send_signal(signal.SIGTERM)
        if self.vllm_server is not None:
            self.vllm_server.stop()
            self.vllm_server = None
        terminate(self.registrars, 15.0)
        self.registrars.clear()
        if self.api is not None:
            terminate([self.api], 10.0)
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
        if self.redis_url_file is not None:
            self.redis_url_file.unlink(missing_ok=True)
        self._children.close_logs()

    def kill(self) -> None:
        """Stop at once, out of order (a second Ctrl-C): SIGKILL every child's process group; Redis
        gets SIGTERM (it exits at once, its append-only file flushed). Jobs that were running are
        re-queued by rq's abandoned-job handling when workers next run."""
        self._stopping.set()
        for process in self.children():
            signal_group(process, signal.SIGKILL)
        self.vllm_server = None
        if self.redis is not None and self.redis.process is not None:
            self.redis.process.terminate()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
