"""The LLM client's errors, one tree: what a caller does next depends on which one it is.

A 4xx is the request's fault (`BackendRequestError`: retrying cannot help); an unreachable or failing
backend (`BackendUnavailable`) and an answer that breaks the token contract (`BadBackendResponse`) are
the backend's, and `complete_routed` fails over from both.
"""

from __future__ import annotations

from shared.errors import RolloutsError


class LLMError(RolloutsError, RuntimeError):
    """Base of every error this client raises."""


class BackendRequestError(LLMError):
    """The backend rejected the request (4xx): retrying the same request cannot help."""

    def __init__(self, status: int, message: str, backend_id: str) -> None:
        super().__init__(f"backend {backend_id} answered {status}: {message}")
        self.status = status
        self.message = message
        self.backend_id = backend_id


class BackendUnavailable(LLMError):
    """The backend could not be reached or kept failing (connect errors, 5xx, timeouts).

    The caller should report the backend to the pool and re-acquire: with the full token
    prefix sent each turn, the trajectory goes on losslessly on another backend.
    """

    def __init__(self, message: str, backend_id: str, timed_out: bool = False) -> None:
        super().__init__(f"backend {backend_id} unavailable: {message}")
        self.backend_id = backend_id
        self.timed_out = timed_out  # a read timeout: the generation may still be running there


class BadBackendResponse(LLMError):
    """The response does not carry token IDs and logprobs that line up (or is not JSON at all)."""

    def __init__(self, message: str, backend_id: str = "") -> None:
        super().__init__(f"backend {backend_id} answered badly: {message}" if backend_id else message)
        self.backend_id = backend_id
