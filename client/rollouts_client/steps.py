"""The steps a call asks its driver for, so one definition of each call serves both clients.

A call (calls.py) is a generator that does no I/O itself: it yields steps (send this request,
sleep, open a stream, ...) and receives each step's result, or has the step's error raised at
the `yield`. RolloutClient performs the steps with httpx.Client and time.sleep, AsyncRolloutClient
with httpx.AsyncClient and asyncio.sleep; neither knows what any call sends or how it reads the
answer. An iterating call (`Stream`) also yields `Emit(item)` for each item its caller gets.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import httpx

    from rollouts_client.wire import RetryPolicy

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    """One HTTP request, one try (the retrying is a call of its own, calls.request): its response."""

    method: str
    path: str
    options: dict[str, Any] = field(default_factory=dict)  # httpx's request arguments: params, json, ...


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Gather:
    """Run these calls (their results, in order): one after another, or concurrently when async."""

    calls: list[Call[Any]]


@dataclass(frozen=True)
class OpenStream:
    """Open a streamed response (closing the one open before): the response, its body read already
    unless the status is 200. The stream stays open until the next OpenStream, a CloseStream, its
    end, or the call's end."""

    method: str
    path: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NextLine:
    """The open stream's next line, or None at its end."""


@dataclass(frozen=True)
class CloseStream:
    """Close the open stream now (before a backoff, not after it)."""


@dataclass(frozen=True)
class Emit(Generic[T]):
    """An item for the caller of an iterating call."""

    item: T


Step = Send | Sleep | Gather | OpenStream | NextLine | CloseStream
Call = Generator[Step, Any, T]  # a call that returns T
Stream = Generator[Step | Emit[T], Any, None]  # a call that yields T's to its caller


class CallingClient(Protocol):
    """What a call reads of its client besides the steps' results."""

    @property
    def retry(self) -> RetryPolicy: ...

    @property
    def http(self) -> httpx.Client | httpx.AsyncClient: ...


class Resumed:
    """A call resumed with each step's result (`reply`) or error (`error`, raised at its `yield`): the
    one way its steps are taken, by `collect` and by both drivers. Iterating gives its steps and items."""

    def __init__(self, call: Generator[Any, Any, Any]) -> None:
        self.call = call
        self.reply: Any = None
        self.error: Exception | None = None

    def __iter__(self) -> Resumed:
        return self

    def __next__(self) -> Step | Emit[Any]:
        reply, error, self.reply, self.error = self.reply, self.error, None, None
        return self.call.throw(error) if error is not None else self.call.send(reply)


def collect(stream: Stream[T], keep: bool = True) -> Call[list[T]]:
    """Run an iterating call inside another call: its steps pass through, its items are kept
    (or dropped, `keep=False`) and returned at its end."""
    items: list[T] = []
    steps = Resumed(stream)
    try:
        for step in steps:
            if isinstance(step, Emit):
                items.extend([step.item] if keep else [])
                continue
            try:
                steps.reply = yield step
            except Exception as exc:  # noqa: BLE001 - the step's error goes to the call that asked for it
                steps.error = exc
    finally:
        stream.close()
    return items


def returning(call: Call[T], into: list[T]) -> Call[None]:
    """The call, its result appended to `into`: how a driver's one loop runs calls and streams alike."""
    into.append((yield from call))
