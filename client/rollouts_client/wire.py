"""What the sync and async clients share: where the API is, headers, body decoding, retry policy, SSE parsing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import msgpack

from rollouts_client.errors import ApiError, RolloutsClientError

MSGPACK = "application/msgpack"

# Where a trainer's client finds the API when its code does not say (a job script exports them).
API_URL_ENV = "ROLLOUTS_API_URL"
API_TOKEN_ENV = "ROLLOUTS_API_TOKEN"


# Groups per long-poll page when each group embeds its n trajectories (the server caps it too).
RESULTS_PAGE_GROUPS = 8


class StreamUnavailable(RolloutsClientError):
    """A 503 answer when (re)opening an event stream: retried with backoff like a dropped connection."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.error = ApiError(response)


@dataclass(frozen=True)
class RetryPolicy:
    """Connection errors and 503s are retried with exponential backoff.

    A POST is retried only when the request cannot have reached the server
    (connect errors): a lost answer to a POST that did arrive would submit twice.
    """

    retries: int = 5
    first_delay_s: float = 0.2
    max_delay_s: float = 5.0

    def delays(self) -> Iterable[float]:
        delay = self.first_delay_s
        for _ in range(self.retries):
            yield delay
            delay = min(delay * 2, self.max_delay_s)

    @staticmethod
    def retryable(
        method: str, exc: Exception | None, response: httpx.Response | None, idempotent: bool = False
    ) -> bool:
        """503s always; transport errors of reads, and of a POST only where it cannot have been taken
        (no connection) unless it carries an Idempotency-Key, which makes a repeat safe."""
        if response is not None:
            return response.status_code == 503
        if method == "POST" and not idempotent:
            return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
        return isinstance(exc, httpx.TransportError)


def endpoint(base_url: str | None, token: str | None) -> tuple[str, str | None]:
    """The URL and token given, else ROLLOUTS_API_URL and ROLLOUTS_API_TOKEN; no URL at all is an error."""
    url = base_url or os.environ.get(API_URL_ENV)
    if not url:
        raise ValueError(f"no API URL: pass base_url or set {API_URL_ENV}")
    return url, token if token is not None else os.environ.get(API_TOKEN_ENV) or None


def headers(token: str | None, msgpack_responses: bool) -> dict[str, str]:
    out = {"Accept": MSGPACK if msgpack_responses else "application/json"}
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def decode(response: httpx.Response, expected: tuple[int, ...] = (200,)) -> Any:
    """The body as Python values (msgpack or JSON by content type); ApiError on any other status."""
    if response.status_code not in expected:
        raise ApiError(response)
    if response.headers.get("content-type", "").startswith(MSGPACK):
        return msgpack.unpackb(response.content, raw=False, strict_map_key=False)
    return json.loads(response.content)


class SseParser:
    """Feed lines of a text/event-stream; yields (event, id, data) for each complete event."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}

    def feed(self, line: str) -> tuple[str, str, Any] | None:
        if line.startswith(":"):
            return None  # a keep-alive comment
        if line:
            name, _, value = line.partition(":")
            self._fields[name] = value.removeprefix(" ")
            return None
        fields, self._fields = self._fields, {}
        if "data" not in fields:
            return None
        return fields.get("event", "message"), fields.get("id", ""), json.loads(fields["data"])


def present(values: dict[str, Any]) -> dict[str, Any]:
    """The values given (not None): what a body or query leaves to the API's defaults is not sent."""
    return {name: value for name, value in values.items() if value is not None}


def batch_body(
    prompts: list[dict[str, Any]] | None,
    prompts_path: str | None,
    n_samples: int,
    min_informative_groups: int | None,
    options: dict[str, Any],
) -> dict[str, Any]:
    given = {"prompts": prompts, "prompts_path": prompts_path, "min_informative_groups": min_informative_groups}
    return {"n_samples": n_samples, **options, **present(given)}


def list_params(
    status: str | None, group_id: str | None, limit: int, offset: int = 0, cursor: str | None = None
) -> dict[str, Any]:
    """GET /v1/jobs's query: the filters given, and the page (by offset, or after a cursor)."""
    page: dict[str, Any] = {"offset": offset} if cursor is None else {"cursor": cursor}
    return {"limit": limit, **page, **present({"status": status, "group_id": group_id})}


def backend_body(
    url: str,
    model: str,
    backend_id: str | None,
    tokenizer: str | None,
    capacity: float | None,
    labels: dict[str, str] | None,
) -> dict[str, Any]:
    """A registration as the API takes it; what is not given is left to the API's defaults."""
    optional = {"id": backend_id, "tokenizer": tokenizer, "capacity": capacity, "labels": labels}
    return {"url": url, "model": model, **present(optional)}


def weights_body(version: str, path: str, pause_mode: str, lora: str | None) -> dict[str, Any]:
    """A weight update as the API takes it (POST /v1/models/{model}/weights)."""
    return {"version": version, "path": str(path), "pause_mode": pause_mode, **present({"lora": lora})}


def weights_upload(version: str, data: bytes, pause_mode: str) -> dict[str, Any]:
    """A weight update sent as bytes, as httpx arguments (PUT /v1/models/{model}/weights): the
    safetensors file is the body, the rest query parameters."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be the bytes of a safetensors file, not {type(data).__name__}")
    return {
        "params": {"version": version, "pause_mode": pause_mode},
        "content": bytes(data),
        "headers": {"Content-Type": "application/octet-stream"},
    }


def weights_path(model: str) -> str:
    """The model's weights route; a served name may hold '/' (org/model), which the route accepts as is."""
    return f"/v1/models/{quote(model, safe='/')}/weights"
