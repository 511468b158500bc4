"""uvicorn serving one ASGI app from a background thread of the process that needs it.

The node gateway runs this way in `rollouts register --gateway` and each external agent's endpoint in
its rollout worker's slot: the process's main thread keeps its own signal handling (uvicorn installs
none off the main thread), and the server lives exactly as long as its owner says.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.types import ASGIApp


class ThreadServer:
    """`app` on `host:port` (port 0: one the OS picks), bound by `start` before uvicorn's thread runs, so a
    caller connecting at once waits in the backlog instead of being refused; `options` go to uvicorn.Config."""

    def __init__(self, app: ASGIApp, host: str, port: int = 0, name: str = "server", **options: Any) -> None:
        self.host, self.port, self.name = host, port, name
        self._config = uvicorn.Config(app, log_level="warning", access_log=False, **options)
        self._server = uvicorn.Server(self._config)
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ThreadServer:
        """Start serving; returns once uvicorn has started, or raises RuntimeError (the port cannot be bound,
        uvicorn exited, or it is slower than `timeout_s`)."""
        try:
            self._socket = _listening(self.host, self.port, self._config.backlog)
        except OSError as exc:
            raise RuntimeError(f"the {self.name} could not listen on {self.host}:{self.port}: {exc}") from None
        self.port = self._socket.getsockname()[1]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name=f"{self.name}-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the {self.name} did not start listening on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, let calls in flight end (up to `timeout_s`, then cut them), then return."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(5.0)
        if self._socket is not None:
            self._socket.close()


def _listening(host: str, port: int, backlog: int) -> socket.socket:
    """A TCP socket bound to `host:port` and listening (IPv6 where the host is an IPv6 address)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock
