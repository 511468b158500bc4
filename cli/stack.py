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
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import httpx

from cli.embedded_redis import EmbeddedRedis, free_port
from cli.procs import die_with_parent
from cli.tiny_model import tiny_model_dir
from cli.vllm_server import VLLMError, VLLMServer
from rollouts_client import ApiError, RetryPolicy, RolloutClient
from shared.config import STAGES, Settings
from shared.errors import RolloutsError
from shared.redis_conn import write_url_file


class StackError(RolloutsError, RuntimeError):
    pass


class Stack:
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
        self.extra_env = extra_env or {}
        self.drain_timeout_s = drain_timeout_s  # the workers' time to finish on stop; None: their setting
        # The model name the stack's vLLM is registered under: its served name, or a LoRA adapter it
        # serves (`--lora-modules NAME=DIR` in vllm_args), so that every job samples from the adapter.
        self.register_as = register_as
        self.redis: EmbeddedRedis | None = None
        self.redis_url = settings.redis_url
        self.redis_url_file: Path | None = None  # set when the stack starts its own Redis
        self.api: subprocess.Popen[bytes] | None = None
        self.vllm_server: VLLMServer | None = None
        self.registrars: list[subprocess.Popen[bytes]] = []
        self.workers: dict[str, list[subprocess.Popen[bytes]]] = {stage: [] for stage in STAGES}
        self._logs: list[IO[bytes]] = []
        self._started_at: dict[int, float] = {}  # worker pid -> when it started (for the restart backoff)

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
            self.vllm_server = VLLMServer.from_settings(self.settings, Path(model), free_port(), log_path=log_path,
                                                        args=args)  # fmt: skip
            self.on_progress(f"starting vLLM on {model} (log: {log_path})")
            self.vllm_server.start()
            self.vllm_server.wait_until_ready(self.settings.vllm_start_timeout_s, self.on_progress)
        except VLLMError as exc:
            raise StackError(str(exc)) from None
        self.on_progress(f"vLLM ready at {self.vllm_server.url}, serving {self.vllm_server.served_name}")
        if self.register_as is None:
            self.register_backend(self.vllm_server.url, self.vllm_server.served_name)
        else:  # an adapter has no tokenizer of its own: it is the base model's
            self.register_backend(self.vllm_server.url, self.register_as, tokenizer=Path(model))
        return self.vllm_server

    def register_backend(self, url: str, model: str | None = None,
                         tokenizer: Path | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
        """Register a running server with the pool as an operator does: `rollouts register` beside it."""
        if model is None:
            model = _the_one_served_model(url, self.settings.llm_probe_timeout_s)
        argv = [sys.executable, "-m", "cli", "register", "--backend-url", url, "--model", model, "--wait-timeout", "60"]
        if tokenizer is not None:
            argv += ["--tokenizer", str(tokenizer)]
        process = self._spawn(f"register-{len(self.registrars)}", argv)
        self.registrars.append(process)
        return process

    def _own_backend_urls(self) -> set[str]:
        urls = {url.rstrip("/") for url in self.backend_urls}
        if self.vllm_server is not None:
            urls.add(self.vllm_server.url.rstrip("/"))
        return urls

    def _wait_for_backends(self, urls: set[str], timeout: float) -> None:
        """Until every one of `urls` is registered, healthy and open to new pins."""
        if not urls:
            return
        deadline = time.monotonic() + timeout
        with self._probe(2.0) as api:
            while time.monotonic() < deadline:
                for registrar in self.registrars:
                    if registrar.poll() is not None:
                        raise StackError(f"`rollouts register` exited with code {registrar.returncode} (see its log)")
                try:
                    open_urls = {b["url"].rstrip("/") for b in api.list_backends()
                                 if b.get("healthy") and not b.get("draining")}  # fmt: skip
                    if urls <= open_urls:
                        return
                except (httpx.HTTPError, ApiError, ValueError, KeyError, AttributeError, TypeError):
                    pass
                time.sleep(0.25)
        raise StackError(f"the LLM backends did not register within {timeout:.0f}s")

    def _probe(self, timeout: float, token: str | None = None) -> RolloutClient:
        """A client for readiness checks: no retries (the callers poll); the stack's token unless given."""
        token = token or self.settings.token or next(iter(self.settings.api_tokens), None)
        return RolloutClient(self.api_url, token, timeout=timeout, retry=RetryPolicy(retries=0))

    def start_worker(self, stage: str, concurrency: int | None = None) -> subprocess.Popen[bytes]:
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
        process = self._spawn(f"{stage}-{index}", argv)
        self._started_at[process.pid] = time.monotonic()
        return process

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        output: IO[bytes] | None = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self.log_dir / f"{name}.log", "ab")
            self._logs.append(output)
        # Each child gets its own process group, so a terminal's Ctrl-C reaches only us and
        # we stop the children in order (workers drain first, then the API).
        return subprocess.Popen(
            argv,
            env=self.env,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )

    def _wait_for_api(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._probe(1.0) as api:
            while time.monotonic() < deadline:
                if self.api is not None and self.api.poll() is not None:
                    raise StackError(f"the API exited with code {self.api.returncode} (port {self.api_port} taken?)")
                if api.health():
                    return
                time.sleep(0.1)
        raise StackError(f"the API did not become healthy within {timeout:.0f}s")

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

    def supervise(self) -> int:
        """Keep the stack up until the API, the backend or a registrar exits (returns its code).

        A worker process that dies (SIGKILL, the OOM killer, a crash) is started again in its place:
        its jobs were handed back or are re-queued by rq's abandoned-job handling, so nothing is lost.
        The pause before a restart doubles while the worker keeps dying young (1 s up to
        RESTART_BACKOFF_MAX_S), so a crash loop is logged and slowed, never spun."""
        pending: dict[tuple[str, int], tuple[float, float]] = {}  # (stage, index) -> (restart at, delay)
        delays: dict[tuple[str, int], float] = {}
        while True:
            others = [p for p in self.children() if not any(p in procs for procs in self.workers.values())]
            for child in others:
                code = child.poll()
                if code is not None:
                    return code
            now = time.monotonic()
            for stage, procs in self.workers.items():
                for index, process in enumerate(procs):
                    key = (stage, index)
                    if key in pending:
                        restart_at, delay = pending[key]
                        if now >= restart_at:
                            del pending[key]
                            procs[index] = self._spawn_worker(stage, index)
                            self.on_progress(f"worker {stage}-{index} restarted (pid {procs[index].pid})")
                        continue
                    code = process.poll()
                    if code is None:
                        continue
                    lived = now - self._started_at.pop(process.pid, now)
                    delay = 1.0 if lived > RESTART_RESET_S else min(2 * delays.get(key, 0.5), RESTART_BACKOFF_MAX_S)
                    delays[key] = delay
                    pending[key] = (now + delay, delay)
                    self.on_progress(f"worker {stage}-{index} (pid {process.pid}) exited with {_exit_text(code)} "
                                     f"after {lived:.0f} s; restarting it in {delay:.0f} s")  # fmt: skip
            time.sleep(0.5)

    def stop(self, timeout: float = 40.0) -> None:
        """Stop in order: the workers (their running jobs handed back through Redis), then the
        registrars (they deregister through the API) and the backend, the API, and Redis last."""
        workers = [p for procs in self.workers.values() for p in procs]
        _terminate(workers, timeout)
        # The registrars (they deregister on SIGTERM, so the API must still be up) and the backend
        # stop side by side: with the workers gone nobody calls the backend any more.
        for registrar in self.registrars:
            if registrar.poll() is None:
                registrar.send_signal(signal.SIGTERM)
        if self.vllm_server is not None:
            self.vllm_server.stop()
            self.vllm_server = None
        _terminate(self.registrars, 15.0)
        self.registrars.clear()
        if self.api is not None:
            _terminate([self.api], 10.0)
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
        if self.redis_url_file is not None:
            self.redis_url_file.unlink(missing_ok=True)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def kill(self) -> None:
        """Stop at once, out of order (a second Ctrl-C): SIGKILL every child's process group; Redis
        gets SIGTERM (it exits at once, its append-only file flushed). Jobs that were running are
        re-queued by rq's abandoned-job handling when workers next run."""
        for process in self.children():
            _signal_group(process, signal.SIGKILL)
        self.vllm_server = None
        if self.redis is not None and self.redis.process is not None:
            self.redis.process.terminate()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# A worker that ran this long before dying restarts after 1 s again; one that keeps dying young waits longer.
RESTART_RESET_S = 60.0
RESTART_BACKOFF_MAX_S = 30.0


def _exit_text(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"


def _terminate(processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal a child's process group (each child leads one: start_new_session)."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _the_one_served_model(url: str, timeout_s: float) -> str:
    """The model a running server serves, for `--backend-url URL` without a name; one model, or say so."""
    try:
        response = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s)
        names = [card["id"] for card in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise StackError(f"{url} is not reachable as an OpenAI-compatible server (GET /v1/models: {exc})") from None
    if len(names) != 1:
        raise StackError(f"{url} serves {names}: register the one to use with `rollouts register --model`")
    return names[0]
