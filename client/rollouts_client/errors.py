"""Errors the client raises, all under one root, each also the built-in a caller would catch for it:

RolloutsClientError
├── ApiError (RuntimeError)             the API's 4xx/5xx, with its message
├── WaitTimeout (TimeoutError)          a wait that ran out before the jobs or the batch ended
├── BatchExhausted (RuntimeError)       a DAPO batch whose prompts ran out before its target
├── RegistrationRefused (RuntimeError)  registration.py: the API refused a backend for good (a 4xx)
├── StreamUnavailable                   wire.py: an event stream answered 503 (retried, then its ApiError)
└── trainers/: JobFailed (RuntimeError), SegmentedRecord (ValueError), RowError (ValueError)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from rollouts_client.models import Batch


class RolloutsClientError(Exception):
    """The root of every exception the client distribution defines: `except RolloutsClientError` catches them all."""


class ApiError(RolloutsClientError, RuntimeError):
    """A non-success answer; `detail` is the API's message (it names the offending field).

    On a 422, `errors` lists each problem as {"field", "message"}, so a caller that sent many
    jobs at once can tell which of them were refused ("body[3].task.kind").
    """

    def __init__(self, response: httpx.Response) -> None:
        detail: object = response.text
        errors: list[dict[str, Any]] = []
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            detail = body.get("detail", response.text)
            errors = [e for e in body.get("errors") or [] if isinstance(e, dict)]
        super().__init__(f"HTTP {response.status_code}: {detail}")
        self.status_code = response.status_code
        try:
            self.url: str | None = str(response.request.url)
        except RuntimeError:  # a response built without its request
            self.url = None
        self.detail = detail
        self.errors = errors


class WaitTimeout(RolloutsClientError, TimeoutError):
    """A wait with a timeout ended before the jobs or the batch did."""


class BatchExhausted(RolloutsClientError, RuntimeError):
    """A DAPO batch whose prompts ran out before its target: `batch.reason` says how far it got.

    Raised by `wait_batch`, and at the end of `iter_groups`, `iter_events` and `collect_groups`
    (unless `partial=True`), so a training loop does not go on with a short batch in silence (0
    informative groups means every prompt got the same reward every time). `received`: the groups
    the stream that raised it had yielded (None from `wait_batch`, which keeps none).
    """

    def __init__(self, batch: Batch, received: int | None = None) -> None:
        got = f"{batch.counts.used} of {batch.target} groups used"
        if received is not None:
            got += f", {received} streamed"
        super().__init__(f"batch {batch.id} could not fill ({got}): {batch.reason}")
        self.batch = batch
        self.received = received
