"""A pass-through in front of a real vLLM server that holds generation calls until the test releases them.

A test double for timing only: every request (health, models, weight routes, generation) is sent
on to the real server unchanged, so what the service records is what vLLM answered. What it adds
is a gate: `hold_after(n)` lets the next `n` generation calls through and holds every later one,
before vLLM sees it, until `release()`. A test that needs a job "still running" at some moment
(a weight update between two of its turns, a kill while it waits on the model) holds it there by
this, not by asking the model for many tokens and hoping the machine is slow enough.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx

from workers.rollout.llm_wire import COMPLETIONS_PATH, GENERATE_PATH

GENERATION_PATHS = frozenset({GENERATE_PATH, COMPLETIONS_PATH, "/v1/chat/completions"})
_HOP_BY_HOP = {"connection", "content-length", "content-encoding", "transfer-encoding", "keep-alive", "host"}


class HoldingProxy:
    """Forwards to `target`; generation calls past the allowance wait on `release()` (at most `max_hold_s`)."""

    def __init__(self, target: str, max_hold_s: float = 600.0) -> None:
        self.target = target.rstrip("/")
        self.max_hold_s = max_hold_s
        self.held = threading.Event()  # a generation call is waiting at the gate
        self.generation_calls = 0  # forwarded ones
        self._lock = threading.Lock()
        self._allowance: int | None = None  # None: the gate is open
        self._open = threading.Event()
        self._open.set()
        self._http = httpx.Client(timeout=httpx.Timeout(max_hold_s, connect=5.0))
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def hold_after(self, n: int) -> None:
        """Let the next `n` generation calls through; hold every later one until `release()`."""
        with self._lock:
            self._allowance = n
            self.held.clear()
            self._open.clear()

    def release(self) -> None:
        """Open the gate: held calls go on to vLLM, and so does every later one."""
        with self._lock:
            self._allowance = None
            self._open.set()

    def _admit(self) -> None:
        """Block the calling request while the gate holds it."""
        with self._lock:
            if self._allowance is None:
                return self._count()
            if self._allowance > 0:
                self._allowance -= 1
                return self._count()
            self.held.set()
        if not self._open.wait(self.max_hold_s):
            raise TimeoutError(f"a generation call was held {self.max_hold_s:.0f} s and never released")
        with self._lock:
            self._count()

    def _count(self) -> None:
        self.generation_calls += 1

    def start(self) -> HoldingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.command == "POST" and urlsplit(self.path).path in GENERATION_PATHS:
                    proxy._admit()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                try:
                    answer = proxy._http.request(self.command, proxy.target + self.path, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    self.send_error(502, f"{type(exc).__name__}: {exc}")
                    return
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._http.close()
