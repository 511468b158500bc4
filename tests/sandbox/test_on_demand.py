"""A job's sandbox on demand (``sandbox_on_demand``): a rollout that calls no tool starts no sandbox and takes
none from the pool; the first tool call opens it (from the pool when one is ready) and later calls reuse it."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import Settings
from workers.rollout.job_sandbox import JobSandbox, OnDemandSandbox, open_job_sandbox
from workers.sandbox import SandboxSpec
from workers.sandbox.pool import SandboxPool
from workers.sandbox.pool_sizing import Demand
from workers.sandbox.profile import SandboxProfile


class _Opened:
    """A stand-in JobSandbox: counts calls and finishes."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.finished = 0
        self.sandbox = self

    def call(self, tool: str, args: dict[str, object], timeout: float | None = None) -> str:
        self.calls.append(tool)
        return "ok"

    def finish(self) -> None:
        self.finished += 1


def test_no_tool_call_opens_nothing_and_finish_is_a_no_op() -> None:
    opened: list[_Opened] = []
    lazy = OnDemandSandbox(lambda: opened.append(_Opened()) or opened[-1])  # type: ignore[arg-type,func-returns-value]
    lazy.finish()
    assert opened == [] and lazy.sandbox is None and lazy.held is None


def test_the_first_call_opens_once_and_finish_ends_it() -> None:
    opened: list[_Opened] = []
    lazy = OnDemandSandbox(lambda: opened.append(_Opened()) or opened[-1])  # type: ignore[arg-type,func-returns-value]
    assert lazy.call("bash", {"command": "true"}) == "ok"
    assert lazy.call("python", {"code": "1"}) == "ok"
    assert len(opened) == 1 and opened[0].calls == ["bash", "python"]
    lazy.finish()
    assert opened[0].finished == 1


def test_an_open_that_fails_leaves_nothing_and_the_next_call_tries_again() -> None:
    tries: list[int] = []

    def open_() -> JobSandbox:
        tries.append(1)
        raise RuntimeError("no sandbox")

    lazy = OnDemandSandbox(open_)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            lazy.call("bash", {"command": "true"})
    assert len(tries) == 2 and lazy.held is None
    lazy.finish()


@pytest.mark.usefixtures("require_bwrap")
def test_a_real_sandbox_opens_at_the_first_call_from_the_pool(short_dir: Path, sandbox_settings: Settings) -> None:
    settings = sandbox_settings.model_copy(update={"state_dir": short_dir / "st", "sandbox_pool_interval_s": 0.2})
    pool = SandboxPool(settings, lambda: Demand(free_slots=1, queue_depth=1))
    try:
        profile = SandboxProfile.of(SandboxSpec(), settings, python=True)
        assert pool.take(profile) is None  # a first job teaches the pool the profile
        assert pool.wait_ready(profile, 1, timeout=120)
        ws = settings.workspaces / "job-1"
        ws.mkdir(parents=True)
        (ws / "input.txt").write_text("from init\n")

        def open_() -> JobSandbox:
            return open_job_sandbox(SandboxSpec(), ws, settings, python=True, lifetime="single-use", pool=pool)

        lazy = OnDemandSandbox(open_)
        assert pool.ready_count(profile) == 1, "nothing was taken before the first call"
        result = lazy.call("bash", {"command": "cat input.txt && echo out > out.txt"})
        assert result.output.strip() == "from init" and not result.is_error
        assert lazy.held is not None and lazy.held.pooled, "the first call took the ready sandbox"
        assert lazy.call("python", {"code": "6 * 7"}).output.strip() == "42"
        box = lazy.sandbox
        lazy.finish()
        assert box is not None and not box.running
        assert (ws / "out.txt").read_text() == "out\n", "the job's files are at its workspace path"
    finally:
        pool.close()


def test_exec_before_any_call_runs_in_a_sandbox_of_its_own_and_stops_it() -> None:
    """A kind's ``collect`` may ``exec`` (the SWE kind's cache cleanup) with no tool called: that needs no tool
    server, so it runs in an unstarted sandbox of the same spec, stopped after, and opens nothing."""
    made: list[_Unstarted] = []
    opened: list[_Opened] = []

    class _Unstarted:
        def __init__(self) -> None:
            self.ran: list[str] = []
            self.stopped = False

        def exec(self, command: str, timeout: float) -> str:
            self.ran.append(command)
            return "exit 0"

        def stop(self) -> None:
            self.stopped = True

    lazy = OnDemandSandbox(
        lambda: opened.append(_Opened()) or opened[-1],  # type: ignore[arg-type,func-returns-value]
        lambda: made.append(_Unstarted()) or made[-1],  # type: ignore[arg-type,func-returns-value]
    )
    assert lazy.exec("rm -rf .pytest_cache", timeout=60) == "exit 0"
    assert opened == [] and lazy.held is None
    assert made[0].ran == ["rm -rf .pytest_cache"] and made[0].stopped
