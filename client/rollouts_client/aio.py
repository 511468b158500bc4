"""AsyncRolloutClient: RolloutClient's methods for asyncio trainers; it runs the calls of calls.py
with httpx.AsyncClient."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import httpx

from rollouts_client.calls import ApiMethods
from rollouts_client.steps import (
    Awaiting,
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


class AsyncRolloutClient(ApiMethods, Awaiting):
    """RolloutClient's methods, each a coroutine, and its iterators async (`async for`).

    `base_url` and `token` default to ROLLOUTS_API_URL and ROLLOUTS_API_TOKEN, as there.
    `wait_jobs` fetches the finished jobs concurrently.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        msgpack: bool = True,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        base_url, token = endpoint(base_url, token)
        self.retry = retry or RetryPolicy()
        self.http = httpx.AsyncClient(
            base_url=base_url, headers=headers(token, msgpack), timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections (an `async with` block does it on leaving)."""
        await self.http.aclose()

    @classmethod
    def _method(cls, defined: Defined) -> Callable[..., Any]:
        if defined.iterates:

            def iterate(self: AsyncRolloutClient, *args: Any, **kwargs: Any) -> Any:
                return drive(self.http, defined.define(self, *args, **kwargs))

            return method_like(iterate, defined, cls, f"AsyncIterator[{defined.returns}]")

        async def coroutine(self: AsyncRolloutClient, *args: Any, **kwargs: Any) -> Any:
            return await run(self.http, defined.define(self, *args, **kwargs))

        return method_like(coroutine, defined, cls, defined.returns)


async def run(http: httpx.AsyncClient, call: Call[T]) -> T:
    """The call's result, its steps awaited one by one."""
    result: list[T] = []
    item: object
    async for item in drive(http, returning(call, result)):
        raise TypeError(f"a call emitted {item!r}: define it as a stream")
    return result[0]


async def drive(http: httpx.AsyncClient, steps: Stream[T]) -> AsyncIterator[T]:
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
                reply = await _perform(http, step, stream)
            except Exception as exc:  # noqa: BLE001 - raised in the call, at the step that failed
                error = exc
    finally:
        await stream.close()
        steps.close()


async def _perform(http: httpx.AsyncClient, step: Step, stream: _OpenStream) -> Any:
    if isinstance(step, Send):
        return await http.request(step.method, step.path, **step.options)
    if isinstance(step, Sleep):
        return await asyncio.sleep(step.seconds)
    if isinstance(step, Gather):
        return list(await asyncio.gather(*(run(http, call) for call in step.calls)))
    if isinstance(step, OpenStream):
        return await stream.open(http, step)
    if isinstance(step, NextLine):
        return await stream.next_line()
    if isinstance(step, CloseStream):
        return await stream.close()
    raise TypeError(f"not a step: {step!r}")


class _OpenStream:
    """The one streamed response a call has open, and its lines."""

    def __init__(self) -> None:
        self.exits = AsyncExitStack()
        self.lines: AsyncIterator[str] | None = None

    async def open(self, http: httpx.AsyncClient, step: OpenStream) -> httpx.Response:
        await self.close()
        response = await self.exits.enter_async_context(http.stream(step.method, step.path, **step.options))
        if response.status_code != 200:
            await response.aread()  # the error's body
        self.lines = response.aiter_lines()
        return response

    async def next_line(self) -> str | None:
        if self.lines is None:
            raise RuntimeError("NextLine without an open stream")
        line = await anext(self.lines, None)
        if line is None:
            await self.close()
        return line

    async def close(self) -> None:
        self.lines = None
        await self.exits.aclose()
