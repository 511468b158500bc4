"""Run a gateway in a thread of the process that registers its backend (`rollouts register --gateway`).

One process per backend does both, so the gateway lives exactly as long as the registration: the
registrar's signal handling stays where it is (the main thread), deregisters first, and only then
stops the gateway, while the pool no longer routes to it.
"""

from __future__ import annotations

import threading
import time

import uvicorn
from starlette.types import ASGIApp

from gateway.app import Gateway, GatewayConfig


class ThreadedServer:
    """uvicorn serving an ASGI app (a gateway: `ThreadedServer.gateway`) on `host:port`, in a background
    thread (uvicorn installs no signal handlers off the main thread)."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level="warning",
                access_log=False,
                # What a call costs the proxy: no forwarded-for rewriting, and the answer's own date and
                # server headers pass through instead of a second pair.
                proxy_headers=False,
                server_header=False,
                date_header=False,
                # Longer than the callers' own keep-alive (httpx: 5 s), so an idle connection is closed by the
                # caller: one the gateway closed just as a call went out on it would fail that call.
                timeout_keep_alive=75,
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="gateway", daemon=True)

    @classmethod
    def gateway(cls, config: GatewayConfig, host: str, port: int) -> ThreadedServer:
        return cls(Gateway(config), host, port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ThreadedServer:
        """Start serving; raises RuntimeError if the port cannot be bound (uvicorn exits) or it is slow."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._thread.is_alive():
            if self._server.started:
                return self
            time.sleep(0.05)
        raise RuntimeError(f"the gateway did not start listening on {self.host}:{self.port} (port in use?)")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, let calls in flight end (up to `timeout_s`), then return."""
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(5.0)
