"""The HTTP side shared by the test doubles of a vLLM backend: JSON replies, `/health` and `/v1/models`."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


class JsonBackendHandler(BaseHTTPRequestHandler):
    """A quiet handler that answers in JSON and serves what registration and the health probe ask.

    A double subclasses it, says what `/v1/models` lists in `models_listing` and answers its own POSTs.
    """

    def log_message(self, *args: Any) -> None:
        pass

    def models_listing(self) -> dict[str, Any]:
        """The body of `GET /v1/models`: the model the double serves, as vLLM lists it."""
        raise NotImplementedError

    def send_json(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_json(200, {})
        elif self.path == "/v1/models":
            self.send_json(200, self.models_listing())
        else:
            self.send_json(404, {"detail": "Not Found"})
