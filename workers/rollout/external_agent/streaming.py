"""A streamed call on a job's endpoint: the session's chat call in a thread of its own, its progress read by the route.

The route answers only once the call has its first tokens, so a call refused or failed before
them gets its status and error body as an unstreamed call does; after that, the format's SSE
events follow the tokens, and a failure ends the stream with the format's error event. The call
runs to its end in its thread whatever becomes of the HTTP stream, so the session's lock never
waits on the agent reading.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from workers.rollout.external_agent import wire


@dataclass(frozen=True)
class Progress:
    """A streamed chat call so far: its id, its prompt's token count, and the reply's text new since the last."""

    call_id: str
    prompt_tokens: int
    text: str


OnProgress = Callable[[Progress], None]


class StreamedCall:
    """One chat call running with `on_progress`; its progress, then its answer (`result`) or its error, in order."""

    def __init__(self, call: Callable[[OnProgress], dict[str, Any]]) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.result: dict[str, Any] | None = None
        self._first_text = ""  # the text of the first progress, which `opened` takes: `texts` gives it first
        threading.Thread(target=self._run, args=(call,), daemon=True, name="external-agent-stream").start()

    def _run(self, call: Callable[[OnProgress], dict[str, Any]]) -> None:
        try:
            result = call(lambda progress: self._put("progress", progress))
        except wire.ExternalAgentError as exc:
            self._put("failed", exc)
        except Exception as exc:  # noqa: BLE001 - an infrastructure failure, said so (as the app's own handler)
            self._put(
                "failed",
                wire.ExternalAgentError(
                    502, f"the service failed this call: {type(exc).__name__}: {exc}", None, "server_error"
                ),
            )
        else:
            self._put("done", result)

    def _put(self, kind: str, value: Any) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, value))

    async def opened(self) -> Progress | None:
        """The first progress, once the first tokens are in; None if the call ended before any (its answer is
        then in `result`). Raises the call's ExternalAgentError if it failed before any token."""
        kind, value = await self._queue.get()
        if kind == "failed":
            raise value
        if kind == "done":
            self.result = value
            return None
        self._first_text = value.text
        return value

    async def texts(self) -> AsyncIterator[str]:
        """The reply's new text as it comes, until the call ends (its answer then in `result`); raises its
        ExternalAgentError if it fails."""
        if self._first_text:
            yield self._first_text
        while True:
            kind, value = await self._queue.get()
            if kind == "failed":
                raise value
            if kind == "done":
                self.result = value
                return
            if value.text:
                yield value.text


async def chat_stream(call: StreamedCall, opened: Progress, model: str) -> AsyncIterator[str]:
    """A streamed chat call's chunks: the role, a content chunk per piece of text as the tokens come, then the
    rest (chat_chunks); a failure after the first chunk ends it with an error chunk (as vLLM's own stream)."""
    base = {"id": opened.call_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(delta: dict[str, Any]) -> str:
        return f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': None}]})}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    sent = ""
    try:
        async for text in call.texts():
            sent += text
            yield chunk({"content": text})
    except wire.ExternalAgentError as exc:
        yield f"data: {json.dumps(exc.body())}\n\n"
        return
    assert call.result is not None
    for line in wire.chat_chunks({**call.result, "created": base["created"]}, sent):
        yield line
