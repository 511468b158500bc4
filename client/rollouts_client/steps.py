"""The steps a call asks its driver for, so one definition of each call serves both clients.

A call (calls.py) is a generator that does no I/O itself: it yields steps (send this request,
sleep, open a stream, ...) and receives each step's result, or has the step's error raised at
the `yield`. RolloutClient performs the steps with httpx.Client and time.sleep, AsyncRolloutClient
with httpx.AsyncClient and asyncio.sleep; neither knows what any call sends or how it reads the
answer. An iterating call (`Stream`) also yields `Emit(item)` for each item its caller gets.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

import httpx

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rollouts_client.wire import RetryPolicy

P = ParamSpec("P")
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


def collect(stream: Stream[T], keep: bool = True) -> Call[list[T]]:
    """Run an iterating call inside another call: its steps pass through, its items are kept
    (or dropped, `keep=False`) and returned at its end."""
    items: list[T] = []
    reply: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                step = stream.throw(error) if error is not None else stream.send(reply)
            except StopIteration:
                return items
            reply, error = None, None
            if isinstance(step, Emit):
                if keep:
                    items.append(step.item)
                continue
            try:
                reply = yield step
            except Exception as exc:  # noqa: BLE001 - the step's error goes to the call that asked for it
                error = exc
    finally:
        stream.close()


def returning(call: Call[T], into: list[T]) -> Call[None]:
    """The call, its result appended to `into`: how a driver's one loop runs calls and streams alike."""
    into.append((yield from call))


# --- the public methods: defined once, made into each client's methods ----------------------------
class Blocking:
    """A client whose methods return results (RolloutClient)."""


class Awaiting:
    """A client whose methods are coroutines and whose iterators are async (AsyncRolloutClient)."""


class Session(Protocol):
    """What a call reads of its client besides the steps' results."""

    @property
    def retry(self) -> RetryPolicy: ...

    @property
    def http(self) -> httpx.Client | httpx.AsyncClient: ...


_RETURNS = re.compile(r"^(Call|Stream)\[(.*)\]$")


class Defined:
    """A public method defined once, by the call function it wraps; each client class makes its
    own method from it (ApiMethods.__init_subclass__) with the call's parameters and docstring."""

    iterates = False

    def __init__(self, define: Callable[..., Any]) -> None:
        self.define = define
        self.__doc__ = define.__doc__
        self.name = define.__name__
        annotation = define.__annotations__.get("return", "")
        match = _RETURNS.match(annotation if isinstance(annotation, str) else "")
        if match is None or (match[1] == "Stream") != self.iterates:
            expected = "Stream[...]" if self.iterates else "Call[...]"
            raise TypeError(f"{self.name} must be annotated '-> {expected}' (a string), not {annotation!r}")
        self.returns = match[2]  # what the sync method returns, or the items it yields


class call(Defined, Generic[P, T]):
    """A method that returns a result: a plain method on RolloutClient, a coroutine on AsyncRolloutClient."""

    def __init__(self, define: Callable[Concatenate[Any, P], Call[T]]) -> None:
        super().__init__(define)

    @overload
    def __get__(self, client: None, owner: type) -> call[P, T]: ...
    @overload
    def __get__(self, client: Blocking, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, client: Awaiting, owner: type) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, client: object, owner: type) -> Any:
        return self  # the clients' own methods shadow this one


class stream(Defined, Generic[P, T]):
    """A method that iterates: an iterator on RolloutClient, an async iterator on AsyncRolloutClient."""

    iterates = True

    def __init__(self, define: Callable[Concatenate[Any, P], Stream[T]]) -> None:
        super().__init__(define)

    @overload
    def __get__(self, client: None, owner: type) -> stream[P, T]: ...
    @overload
    def __get__(self, client: Blocking, owner: type) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(self, client: Awaiting, owner: type) -> Callable[P, AsyncIterator[T]]: ...
    def __get__(self, client: object, owner: type) -> Any:
        return self


def method_like(method: Callable[..., Any], defined: Defined, owner: type, returns: str) -> Callable[..., Any]:
    """`method` named, documented and signed as the call it runs (`self` for the client, `returns`
    as its return type), so help(), IDEs and inspect.signature show the one definition on both clients."""
    signature = inspect.signature(defined.define)
    client, *parameters = signature.parameters.values()
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[client.replace(name="self", annotation=inspect.Parameter.empty), *parameters],
        return_annotation=returns,
    )
    annotations = {k: v for k, v in defined.define.__annotations__.items() if k != client.name}
    method.__annotations__ = {**annotations, "return": returns}
    method.__name__ = defined.name
    method.__qualname__ = f"{owner.__name__}.{defined.name}"
    method.__module__ = owner.__module__
    method.__doc__ = defined.__doc__
    return method
