"""The local stack's LLM backends in the pool: a `rollouts register` process beside each, as an operator runs it.

When the stack listens beyond loopback (remote workers and trainers), a backend on this machine's
loopback is registered behind a node gateway on the API's address, as on a cluster (gateway/).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from cli.connect import advertised_host, is_loopback, url_host
from cli.embedded_redis import free_port
from cli.stack_errors import StackError
from rollouts_client import ApiError, RolloutClient
from shared.backend_pool.probe import ProbeError, served_models

Spawn = Callable[[str, list[str]], "subprocess.Popen[bytes]"]


class Registrars:
    """Each registered backend's registrar (`processes`, in registration order) and the command line that
    starts it again; `gateway_host`: the API's address when it is beyond loopback, else None."""

    def __init__(self, gateway_host: str | None, probe_timeout_s: float, spawn: Spawn, lock: threading.RLock) -> None:
        self.gateway_host = gateway_host
        self.probe_timeout_s = probe_timeout_s
        self.processes: list[subprocess.Popen[bytes]] = []
        self._argv: list[list[str]] = []  # each registrar's command line, to start it again
        self._registered_urls: dict[str, str] = {}  # a backend's URL -> the one the pool knows (its gateway's)
        self._spawn = spawn
        self._lock = lock

    def register(
        self, url: str, model: str | None = None, tokenizer: Path | None = None, slot: int | None = None
    ) -> subprocess.Popen[bytes]:
        """Register a running server with the pool as an operator does: `rollouts register` beside it.
        `slot`: replace that registrar (one that has exited) instead of adding one."""
        if model is None:
            model = _the_one_served_model(url, self.probe_timeout_s)
        argv = [
            sys.executable,
            "-m",
            "cli",
            "register",
            "--backend-url",
            url,
            "--model",
            model,
            "--wait-timeout",
            "60",
            *self._gateway_args(url),
        ]
        if tokenizer is not None:
            argv += ["--tokenizer", str(tokenizer)]
        with self._lock:
            if slot is None:
                self._argv.append(argv)
                self.processes.append(self._spawn(f"register-{len(self.processes)}", argv))
                return self.processes[-1]
            self._argv[slot] = argv
            return self.respawn(slot)

    def respawn(self, slot: int) -> subprocess.Popen[bytes]:
        """The registrar of `slot` again, on its command line."""
        with self._lock:
            self.processes[slot] = self._spawn(f"register-{slot}", self._argv[slot])
            return self.processes[slot]

    def registered_url(self, url: str) -> str:
        """The URL the pool knows a backend of this stack by: its gateway's, when it has one."""
        return self._registered_urls.get(url.rstrip("/"), url.rstrip("/"))

    def _gateway_args(self, url: str) -> list[str]:
        """`rollouts register` options that put a loopback backend behind a gateway on the API's address
        (the same port on every restart of its registrar); none on loopback."""
        if self.gateway_host is None or not is_loopback(url_host(url)):
            return []
        registered = self._registered_urls.get(url.rstrip("/"))
        if registered is None:
            registered = f"http://{advertised_host(self.gateway_host)}:{free_port()}"
            self._registered_urls[url.rstrip("/")] = registered
        port = registered.rsplit(":", 1)[1]
        return ["--gateway", f"{self.gateway_host}:{port}", "--advertise-url", registered]

    def wait_until_open(self, api: RolloutClient, urls: set[str], timeout: float) -> None:
        """Until every one of `urls` is registered, healthy and open to new pins (asked of `api`)."""
        if not urls:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for registrar in self.processes:
                if registrar.poll() is not None:
                    raise StackError(f"`rollouts register` exited with code {registrar.returncode} (see its log)")
            try:
                open_urls = {
                    b["url"].rstrip("/") for b in api.list_backends() if b.get("healthy") and not b.get("draining")
                }
                if urls <= open_urls:
                    return
            except (httpx.HTTPError, ApiError, ValueError, KeyError, AttributeError, TypeError):
                pass
            time.sleep(0.25)
        raise StackError(f"the LLM backends did not register within {timeout:.0f}s")


def _the_one_served_model(url: str, timeout_s: float) -> str:
    """The model a running server serves, for `--backend-url URL` without a name; one model, or say so."""
    try:
        names = list(served_models(url, timeout_s))
    except ProbeError as exc:
        raise StackError(f"{url} is not reachable as an OpenAI-compatible server: {exc}") from None
    if len(names) != 1:
        raise StackError(f"{url} serves {names}: register the one to use with `rollouts register --model`")
    return names[0]
