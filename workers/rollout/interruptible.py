"""Wait for a blocking call, but give up the moment the stage is interrupted.

An LLM request cannot be aborted from another thread, and a long generation on a busy
backend can take minutes: a cancelled or timed-out job should not wait for it. The call
runs on a helper thread; the slot thread waits for whichever comes first, the result or
the interruption (StageInterrupted). An abandoned call finishes on its own, bounded by the
client's request timeout, and then runs `on_abandoned` once (the rollout releases its pin).

Each call's interrupt hook is removed once it settles, so a long rollout does not pile up
one hook per LLM call. The helper threads come from one pool per process, sized for the
worker's rollout slots with room for abandoned calls still finishing (2 x
rollout_concurrency, at least 16).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from shared.tasks.context import StageContext

T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
MIN_THREADS = 16


def _pool(ctx: StageContext) -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            size = max(MIN_THREADS, 2 * int(ctx.settings.rollout_concurrency))
            _executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="llm-call")
        return _executor


def call_interruptibly(ctx: StageContext, fn: Callable[[], T], on_abandoned: Callable[[], None] | None = None) -> T:
    """`fn()`'s result, or StageInterrupted as soon as `ctx` is interrupted while it runs."""
    ctx.check()
    settled = threading.Event()
    lock = threading.Lock()
    state = {"abandoned": False, "cleaned": False}

    def clean_up_once() -> bool:
        with lock:
            due = state["abandoned"] and not state["cleaned"] and future.done()
            state["cleaned"] = state["cleaned"] or due
        return due

    def finished(_: Future[T]) -> None:
        settled.set()
        if clean_up_once() and on_abandoned is not None:
            on_abandoned()

    def wake(_reason: str) -> None:
        settled.set()

    future = _pool(ctx).submit(fn)
    ctx.on_interrupt(wake)
    try:
        future.add_done_callback(finished)
        # The deadline interrupts only when someone looks: look when it passes.
        while not settled.wait(timeout=max(0.05, ctx.remaining)):
            if ctx.interrupted is not None:
                break
    finally:
        ctx.remove_on_interrupt(wake)
    if future.done():
        return future.result()
    with lock:
        state["abandoned"] = True
    if clean_up_once() and on_abandoned is not None:  # it finished just now, before the flag was seen
        on_abandoned()
    ctx.check()
    raise AssertionError("woken without a result or an interruption")
