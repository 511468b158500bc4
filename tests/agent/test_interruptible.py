"""A call the stage can walk away from: result, exception, cancel, deadline, and the abandoned call's clean-up."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from shared.config import Settings
from shared.jobs.spec import JobRequest
from shared.tasks import StageContext, StageInterrupted
from workers.rollout.interruptible import call_interruptibly


def stage(tmp_path: Path, seconds: float = 3600) -> StageContext:
    return StageContext(
        job_id="j",
        stage="rollout",
        request=JobRequest(task={"kind": "demo"}),
        outputs={},
        workspace=tmp_path,
        settings=Settings(state_dir=tmp_path),
        deadline=time.time() + seconds,
    )


def test_the_result_and_the_exception_come_through(tmp_path: Path) -> None:
    ctx = stage(tmp_path)
    assert call_interruptibly(ctx, lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        call_interruptibly(ctx, lambda: 1 / 0)


def test_a_cancel_returns_at_once_and_the_abandoned_call_cleans_up_once(tmp_path: Path) -> None:
    ctx = stage(tmp_path)
    started, release, cleaned_event = threading.Event(), threading.Event(), threading.Event()
    count_lock, cleaned = threading.Lock(), [0]

    def blocked() -> str:
        started.set()
        release.wait()
        return "late"

    def on_abandoned() -> None:
        with count_lock:
            cleaned[0] += 1
        cleaned_event.set()

    canceller = threading.Thread(target=lambda: (started.wait(), ctx.interrupt("cancelled")))
    canceller.start()
    with pytest.raises(StageInterrupted) as stopped:
        call_interruptibly(ctx, blocked, on_abandoned=on_abandoned)
    canceller.join()
    with count_lock:
        assert stopped.value.reason == "cancelled" and not release.is_set() and cleaned[0] == 0
    release.set()
    # The slot thread's own clean-up check already ran (and found the call running), so the call's
    # done callback is the only caller left: once it has run, the count is final.
    assert cleaned_event.wait(30), "the abandoned call never cleaned up"
    with count_lock:
        assert cleaned[0] == 1


def test_settled_calls_leave_no_interrupt_hooks_behind(tmp_path: Path) -> None:
    ctx = stage(tmp_path)
    for i in range(50):
        assert call_interruptibly(ctx, lambda i=i: i) == i
    with pytest.raises(ZeroDivisionError):
        call_interruptibly(ctx, lambda: 1 / 0)
    assert ctx._on_interrupt == []


def test_the_deadline_passing_mid_call_interrupts_it(tmp_path: Path) -> None:
    ctx = stage(tmp_path, seconds=0.3)
    release = threading.Event()
    with pytest.raises(StageInterrupted) as stopped:
        call_interruptibly(ctx, release.wait)
    release.set()
    assert stopped.value.reason == "timed_out"


def test_an_already_interrupted_stage_does_not_start_the_call(tmp_path: Path) -> None:
    ctx = stage(tmp_path)
    ctx.interrupt("requeue")
    ran = []
    with pytest.raises(StageInterrupted):
        call_interruptibly(ctx, lambda: ran.append(1))
    assert ran == []
