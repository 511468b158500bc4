"""The routes a node gateway forwards, the token each needs, and what a control call may ask for.

A short list, and nothing else: vLLM's dev mode also serves routes that sleep the engine, run a
profiler or reset the whole server, and `/collective_rpc` calls any worker method by name. Of the
control calls, only the ones a weight update makes (shared/weights/vllm_routes.py) pass, with
their bodies checked here before vLLM sees them: a reload reads a directory under the configured
checkpoint roots, an upload is at most as large as the API would send, a LoRA load replaces an
adapter the server already serves.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from shared.weights.checkpoint import outside_roots


class Scope(enum.Enum):
    """Who may call a route: any holder of the deployment token, or only of the admin token."""

    DATA = "data"
    CONTROL = "control"


ROUTES: dict[tuple[str, str], Scope] = {
    ("POST", "/inference/v1/generate"): Scope.DATA,  # the workers' token-in/token-out route
    ("POST", "/v1/completions"): Scope.DATA,  # its fallback (workers/rollout/llm_client.py)
    ("GET", "/v1/models"): Scope.DATA,  # registration reads the served model and its tokenizer root
    ("GET", "/health"): Scope.DATA,
    ("GET", "/metrics"): Scope.DATA,
    ("GET", "/weight_info"): Scope.DATA,  # registration's stale-weights check (shared/weights/versions.py)
    ("POST", "/pause"): Scope.CONTROL,
    ("POST", "/resume"): Scope.CONTROL,
    ("POST", "/collective_rpc"): Scope.CONTROL,
    ("POST", "/v1/load_lora_adapter"): Scope.CONTROL,
    ("POST", "/reset_prefix_cache"): Scope.CONTROL,
    ("POST", "/update_weight_version"): Scope.CONTROL,
}

RELOAD_METHOD = "reload_weights"  # vLLM's own: kwargs.weights_path, a directory the server reads
UPLOAD_METHOD = "load_weights_from_bytes"  # the worker extension's (cli/vllm_extension/): kwargs.data, base64


class Refused(Exception):
    """A request the gateway answers itself, never forwarding it: `status` and a message naming why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ControlPolicy:
    """What a control call's body may ask for on this node."""

    checkpoint_roots: list[str]

    def check(self, path: str, body: bytes) -> ReloadedAdapter | None:
        """Raise Refused unless the call is one a weight update makes; a LoRA load's adapter name is
        returned for the caller to check against what the server serves (only vLLM knows that)."""
        if path == "/collective_rpc":
            self._check_rpc(_json_object(body))
        elif path == "/v1/load_lora_adapter":
            fields = _json_object(body)
            name, adapter_path = fields.get("lora_name"), fields.get("lora_path")
            if not isinstance(name, str) or not isinstance(adapter_path, str):
                raise Refused(400, "load_lora_adapter needs lora_name and lora_path as strings")
            if fields.get("load_inplace") is not True:
                raise Refused(
                    403,
                    "only load_inplace: true passes the gateway: a weight update replaces the "
                    "served adapter, it never adds one",
                )
            self.check_checkpoint(adapter_path)
            return ReloadedAdapter(name)
        return None

    def _check_rpc(self, body: dict[str, Any]) -> None:
        method, kwargs = body.get("method"), body.get("kwargs", {})
        if body.get("args"):
            raise Refused(403, "collective_rpc args do not pass the gateway (a weight update passes kwargs)")
        if not isinstance(kwargs, dict):
            raise Refused(400, "collective_rpc kwargs must be an object")
        if method == RELOAD_METHOD:
            if set(kwargs) != {"weights_path"} or not isinstance(kwargs["weights_path"], str):
                raise Refused(403, f"{RELOAD_METHOD} passes the gateway with kwargs.weights_path alone")
            self.check_checkpoint(kwargs["weights_path"])
        elif method == UPLOAD_METHOD:
            if set(kwargs) != {"data"} or not isinstance(kwargs["data"], str):
                raise Refused(403, f"{UPLOAD_METHOD} passes the gateway with kwargs.data alone")
        else:
            raise Refused(
                403,
                f"collective_rpc method {method!r} does not pass the gateway "
                f"(only {RELOAD_METHOD} and {UPLOAD_METHOD})",
            )

    def check_checkpoint(self, path: str) -> None:
        """Refuse a checkpoint path outside every root, after resolving symlinks and `..`."""
        if not self.checkpoint_roots:
            raise Refused(
                403,
                f"reloading {path} is refused: this gateway has no checkpoint roots "
                "(set ROLLOUTS_CHECKPOINT_ROOTS to the directories trainers save under)",
            )
        if reason := outside_roots(path, self.checkpoint_roots):
            raise Refused(403, reason)


@dataclass(frozen=True)
class ReloadedAdapter:
    """A LoRA load's adapter name, allowed only if the server already serves an adapter by that name."""

    name: str

    def check(self, models: dict[str, Any]) -> None:
        """`models`: vLLM's GET /v1/models answer, where an adapter is an entry with a `parent`."""
        entries = [entry for entry in models.get("data", []) if isinstance(entry, dict)]
        served = {entry.get("id") for entry in entries if entry.get("parent")}
        if self.name not in served:
            names = ", ".join(sorted(str(n) for n in served)) or "none"
            raise Refused(403, f"LoRA adapter {self.name!r} is not served here (served adapters: {names})")


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        raise Refused(400, "the body is not JSON") from None
    if not isinstance(value, dict):
        raise Refused(400, "the body must be a JSON object")
    return value
