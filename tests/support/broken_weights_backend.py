"""A test double of a vLLM server whose weight-update routes fail or hang: fault injection only.

It serves what registration and the health probe ask (`GET /health`, `GET /v1/models` listing one
model with a `root`; with `weight_version`, `GET /weight_info` as vLLM does), and answers every weight route (`/pause`, `/collective_rpc`, ...) with a
500, or holds it until `release` is set when started with `hang=True`. It generates nothing.
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Any

from tests.support.json_backend import JsonBackendHandler


class BrokenWeightsBackend:
    """A backend that is up and healthy but cannot take new weights."""

    def __init__(self, model: str, root: str = "", hang: bool = False, weight_version: str | None = None) -> None:
        self.model, self.root, self.hang = model, root, hang
        self.weight_version = weight_version
        self.release = threading.Event()
        self.received = threading.Event()  # a weight route was called
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> BrokenWeightsBackend:
        double = self

        class Handler(JsonBackendHandler):
            def models_listing(self) -> dict[str, Any]:
                return {"data": [{"id": double.model, "root": double.root}]}

            def do_GET(self) -> None:
                if self.path == "/weight_info" and double.weight_version is not None:
                    self.send_json(200, {"weight_version": double.weight_version})
                else:
                    super().do_GET()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                double.received.set()
                if double.hang:
                    double.release.wait(60)
                self.send_json(
                    500, {"error": {"message": "injected failure", "type": "InternalServerError", "code": 500}}
                )

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
