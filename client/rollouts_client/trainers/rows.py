"""A trainer's dataset row as a service job: which field is the task, how sampling maps, the idempotency key.

The mapping, the same for both trainers: the row carries the service task as `rollouts_task`
(in verl's `extra_info`, or as a column of its own; in SkyRL's `env_extras`), a dict whose
`kind` names the task kind (`{"kind": "math", "problem": ..., "answer": ...}`). The service's kind
renders the prompt from it, so the trainer's own chat prompt is not sent. A row that cannot be
turned into a job raises RowError naming the row and the field, before anything is submitted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from rollouts_client.errors import RolloutsClientError

TASK_FIELD = "rollouts_task"
KEY_FIELD = "rollouts_key"


class RowError(RolloutsClientError, ValueError):
    """A row the mapping cannot turn into a job: `row` and `field` say which and where."""

    def __init__(self, row: str, field: str, problem: str) -> None:
        super().__init__(f"row {row}: {field}: {problem}")
        self.row = row
        self.field = field


def plain(value: Any) -> Any:
    """numpy scalars, 0-d and object arrays (how trainers hand row fields over) as plain Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def task_from(value: Any, row: str, field: str) -> dict[str, Any]:
    """The task dict (a JSON string is accepted: some tables store nested columns as text), checked for a kind."""
    value = plain(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(row, field, f"not a JSON object ({exc})") from None
    if not isinstance(value, dict):
        raise RowError(row, field, f"a dict with the service task, not {type(value).__name__}")
    kind = value.get("kind") or value.get("format")
    if not isinstance(kind, str) or not kind:
        raise RowError(row, f"{field}.kind", "required, a non-empty string (the task kind)")
    return value


def sampling_from(params: Mapping[str, Any], max_tokens: int | None = None) -> dict[str, Any]:
    """The trainer's sampling parameters under the service's names; what the service has no name for is dropped
    (logprobs: the record always has them)."""
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop"):
        if params.get(name) is not None:
            out[name] = plain(params[name])
    if out.get("top_k") == 0:
        out["top_k"] = -1
    limit = params.get("max_tokens", params.get("max_generate_length", max_tokens))
    if limit is not None:
        out["max_tokens"] = int(limit)
    return out


def idempotency_key(*parts: object) -> str:
    """A key of fixed length from the parts that identify one trajectory of one run."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return f"tr-{digest[:48]}"


def group_id(*parts: object) -> str:
    """A group id the service accepts (letters, digits, `_.:-`; 128 at most) for an arbitrary instance id."""
    return f"tr-{hashlib.sha256(chr(31).join(str(p) for p in parts).encode()).hexdigest()[:40]}"
