"""The error bodies an external agent's client reads: OpenAI's, and Anthropic's for `/v1/messages` calls.

Shared by the API's forwarding route (api/routes/external_agent.py) and the job's endpoint (workers/rollout/external_agent/),
so a refusal has the same shape whichever of them refuses.
"""

from __future__ import annotations

from typing import Any

# Anthropic's error types, by the OpenAI-style kinds both refusers use; any other kind keeps its name
# (authentication_error, permission_error, not_found_error, invalid_request_error are Anthropic's too).
_ANTHROPIC_TYPES = {
    "server_error": "api_error",
    "service_unavailable": "overloaded_error",
    "conflict": "invalid_request_error",
}


def openai_error(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def anthropic_error(message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """Anthropic's body; a field goes first in the message as Anthropic names it (`messages.0.role: ...`)."""
    if param:
        message = f"{param.replace('[', '.').replace(']', '')}: {message}"
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(kind, kind), "message": message}}
