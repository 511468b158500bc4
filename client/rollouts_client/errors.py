"""Errors the client raises: the API's 4xx/5xx with its message, and waits that ran out."""

from __future__ import annotations

import httpx


class ApiError(RuntimeError):
    """A non-success answer; `detail` is the API's message (it names the offending field)."""

    def __init__(self, response: httpx.Response) -> None:
        detail: object = response.text
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            pass
        super().__init__(f"HTTP {response.status_code}: {detail}")
        self.status_code = response.status_code
        self.detail = detail


class WaitTimeout(TimeoutError):
    """A wait with a timeout ended before the jobs or the batch did."""
