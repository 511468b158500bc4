"""What the CLI prints when a command fails for a reason outside it: one line and a distinct exit code.

A user whose API is down, whose token is wrong or whose input was refused needs to know what
happened, where, and what to do, not a 60-line traceback; `rollouts --verbose ...` still shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from cli.tracking import RowsRefused
from rollouts_client import ApiError, BatchExhausted


@dataclass(frozen=True)
class Failure:
    message: str
    exit_code: int


# Exit codes (2 is click's own: a usage error).
API_UNREACHABLE = 3
NOT_ALLOWED = 4
REFUSED = 5
SERVER_ERROR = 6
BATCH_SHORT = 7


def describe(exc: BaseException) -> Failure | None:
    """The one line for an exception the CLI can explain, or None (then it is a bug: show it all)."""
    if isinstance(exc, httpx.TimeoutException):
        where = _origin(exc.request.url) if _has_request(exc) else "the API"
        return Failure(
            f"{where} did not answer in time ({type(exc).__name__}); is it overloaded or stopped?", API_UNREACHABLE
        )
    if isinstance(exc, httpx.TransportError):
        where = _origin(exc.request.url) if _has_request(exc) else "the API"
        return Failure(
            f"cannot reach the API at {where} ({_reason(exc)}). Is `rollouts up` (or `rollouts api`) "
            "running there? Point ROLLOUTS_API_URL at it.",
            API_UNREACHABLE,
        )
    if isinstance(exc, ApiError):
        return _api_failure(exc)
    if isinstance(exc, BatchExhausted):
        return Failure(str(exc), BATCH_SHORT)
    if isinstance(exc, RowsRefused):
        return Failure(str(exc), REFUSED)
    return None


def _api_failure(exc: ApiError) -> Failure:
    where = f" at {exc.url}" if getattr(exc, "url", None) else ""
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 401:
        return Failure(
            f"the API{where} needs a valid token (401): set ROLLOUTS_TOKEN to one of its ROLLOUTS_API_TOKENS",
            NOT_ALLOWED,
        )
    if exc.status_code == 403:
        return Failure(f"not allowed (403){where}: {detail}", NOT_ALLOWED)
    if exc.status_code >= 500:
        return Failure(f"the API{where} failed (HTTP {exc.status_code}): {detail}; retry, or see its log", SERVER_ERROR)
    return Failure(f"refused (HTTP {exc.status_code}){where}: {detail}", REFUSED)


def _has_request(exc: httpx.RequestError) -> bool:
    try:
        _ = exc.request  # httpx raises RuntimeError when the error was built without one
    except RuntimeError:
        return False
    return True


def _origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode()}"


def _reason(exc: httpx.TransportError) -> str:
    text = str(exc).strip()
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    return text.splitlines()[-1][:200] if text else type(exc).__name__
