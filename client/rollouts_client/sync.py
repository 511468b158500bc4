"""RolloutClient: the synchronous client a trainer imports; it runs the calls of calls.py with httpx.Client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any, TypeVar

import httpx

from rollouts_client.calls import ApiMethods
from rollouts_client.steps import (
    Blocking,
    Call,
    CloseStream,
    Defined,
    Emit,
    Gather,
    NextLine,
    OpenStream,
    Send,
    Sleep,
    Step,
    Stream,
    method_like,
    returning,
)
from rollouts_client.wire import RetryPolicy, endpoint, headers

T = TypeVar("T")


class RolloutClient(ApiMethods, Blocking):
    """Submit jobs and batches, wait for them, stream a batch's groups, cancel; register LLM backends.

    `base_url` and `token` default to the environment's ROLLOUTS_API_URL and
    ROLLOUTS_API_TOKEN, so a job script can point a trainer at the service without
    code changes. Responses come as msgpack by default (`msgpack=False` for JSON);
    connection errors and 503s are retried (see RetryPolicy). Each method is defined
    once, in rollouts_client.calls, and AsyncRolloutClient has the same ones.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        msgpack: bool = True,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base_url, token = endpoint(base_url, token)
        self.retry = retry or RetryPolicy()
        self.http = httpx.Client(
            base_url=base_url, headers=headers(token, msgpack), timeout=timeout, transport=transport
        )

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (a `with` block does it on leaving)."""
        self.http.close()

    @classmethod
    def _method(cls, defined: Defined) -> Callable[..., Any]:
        if defined.iterates:

            def iterate(self: RolloutClient, *args: Any, **kwargs: Any) -> Any:
                return drive(self.http, defined.define(self, *args, **kwargs))

            return method_like(iterate, defined, cls, f"Iterator[{defined.returns}]")

        def method(self: RolloutClient, *args: Any, **kwargs: Any) -> Any:
            return run(self.http, defined.define(self, *args, **kwargs))

        return method_like(method, defined, cls, defined.returns)


def run(http: httpx.Client, call: Call[T]) -> T:
    """The call's result, its steps performed one by one."""
    result: list[T] = []
    item: object
    for item in drive(http, returning(call, result)):
        raise TypeError(f"a call emitted {item!r}: define it as a stream")
    return result[0]


def drive(http: httpx.Client, steps: Stream[T]) -> Iterator[T]:
    """Perform each step the call yields and send it the result, or raise the step's error at its
    `yield`; yield what it emits. The call's open stream is closed however it ends."""
    stream = _OpenStream()
    reply: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                step = steps.throw(error) if error is not None else steps.send(reply)
            except StopIteration:
                return
            reply, error = None, None
            if isinstance(step, Emit):
                yield step.item
                continue
            try:
                reply = _perform(http, step, stream)
            except Exception as exc:  # noqa: BLE001 - raised in the call, at the step that failed
                error = exc
    finally:
        stream.close()
        steps.close()


def _perform(http: httpx.Client, step: Step, stream: _OpenStream) -> Any:
    if isinstance(step, Send):
        return http.request(step.method, step.path, **step.options)
    if isinstance(step, Sleep):
        return time.sleep(step.seconds)
    if isinstance(step, Gather):
        return [run(http, call) for call in step.calls]
    if isinstance(step, OpenStream):
        return stream.open(http, step)
    if isinstance(step, NextLine):
        return stream.next_line()
    if isinstance(step, CloseStream):
        return stream.close()
    raise TypeError(f"not a step: {step!r}")


class _OpenStream:
    """The one streamed response a call has open, and its lines."""

    def __init__(self) -> None:
        self.exits = ExitStack()
        self.lines: Iterator[str] | None = None

    def open(self, http: httpx.Client, step: OpenStream) -> httpx.Response:
        self.close()
        response = self.exits.enter_context(http.stream(step.method, step.path, **step.options))
        if response.status_code != 200:
            response.read()  # the error's body
        self.lines = response.iter_lines()
        return response

    def next_line(self) -> str | None:
        if self.lines is None:
            raise RuntimeError("NextLine without an open stream")
        line = next(self.lines, None)
        if line is None:
            self.close()
        return line

    def close(self) -> None:
        self.lines = None
        self.exits.close()
