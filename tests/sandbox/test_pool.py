"""The sandbox pool with real bubblewrap sandboxes: a job takes a ready one with its files, single-use
sandboxes are replaced, pooling that cannot work falls back to the job's own start, and a burst never
has more sandboxes starting than the cap."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.config import Settings
from tests.support.waiting import wait_for
from workers.rollout.job_sandbox import JobSandbox, open_job_sandbox, sandbox_pool
from workers.sandbox import SandboxError, SandboxSpec
from workers.sandbox.pool import SandboxPool
from workers.sandbox.pool_sizing import Demand
from workers.sandbox.profile import SandboxProfile
from workers.sandbox.start_gate import reset_start_gate, start_gate
from workers.toolserver.kernel_forks import KERNEL_NAME

pytestmark = pytest.mark.usefixtures("require_bwrap")


@pytest.fixture()
def pool_settings(short_dir: Path, sandbox_settings: Settings) -> Settings:
    return sandbox_settings.model_copy(update={"state_dir": short_dir / "st", "sandbox_pool_interval_s": 0.2})


@pytest.fixture()
def pool(pool_settings: Settings) -> Iterator[SandboxPool]:
    made = SandboxPool(pool_settings, lambda: Demand(free_slots=1, queue_depth=1))
    yield made
    made.close()


def _job_workspace(settings: Settings, job: str, files: dict[str, str]) -> Path:
    ws = settings.workspaces / job
    ws.mkdir(parents=True)
    for name, text in files.items():
        (ws / name).write_text(text)
    return ws


def _open(settings: Settings, ws: Path, pool: SandboxPool | None, lifetime: str = "single-use") -> JobSandbox:
    return open_job_sandbox(SandboxSpec(), ws, settings, python=True, lifetime=lifetime, pool=pool)


def _learn(pool: SandboxPool, settings: Settings) -> SandboxProfile:
    """A first job teaches the pool its profile (and starts cold); then one is made ready."""
    profile = SandboxProfile.of(SandboxSpec(), settings, python=True)
    assert pool.take(profile) is None
    assert pool.wait_ready(profile, 1, timeout=120)
    return profile


def test_a_job_takes_a_ready_warm_sandbox_holding_its_files(pool: SandboxPool, pool_settings: Settings) -> None:
    _learn(pool, pool_settings)
    ws = _job_workspace(pool_settings, "job1", {"given.txt": "from init\n"})
    held = _open(pool_settings, ws, pool)
    try:
        assert pool.stats.handed == 1
        box = held.sandbox
        assert box.workspace == ws.resolve()
        # the kernel was started ahead: it runs before the job's first python call
        assert KERNEL_NAME in box.call("bash", {"command": "ps -e -o comm"}).output.split()
        assert box.call("bash", {"command": "cat given.txt; echo made > out.txt"}).output == "from init\n"
        assert box.call("python", {"code": "open('out.txt').read()"}).output == "'made\\n'\n"
        assert (ws / "out.txt").read_text() == "made\n"  # where the eval stage reads it
    finally:
        held.finish()
    assert not box.running
    assert (ws / "out.txt").exists()


def test_single_use_sandboxes_are_stopped_and_the_pool_refills(pool: SandboxPool, pool_settings: Settings) -> None:
    profile = _learn(pool, pool_settings)
    first = _open(pool_settings, _job_workspace(pool_settings, "a", {}), pool)
    first.finish()
    assert not first.sandbox.running
    assert pool.wait_ready(profile, 1, timeout=120)
    second = _open(pool_settings, _job_workspace(pool_settings, "b", {}), pool)
    try:
        assert second.sandbox is not first.sandbox
        assert pool.stats.handed == 2
    finally:
        second.finish()


def test_the_pool_setting_off_means_no_pool(pool_settings: Settings) -> None:
    assert sandbox_pool(pool_settings.model_copy(update={"sandbox_pool": False})) is None


def test_a_profile_nobody_asks_for_is_stopped(pool_settings: Settings) -> None:
    settings = pool_settings.model_copy(update={"sandbox_pool_idle_s": 0.5})
    pool = SandboxPool(settings, lambda: Demand(free_slots=1, queue_depth=1))
    try:
        assert pool.take(SandboxProfile.of(SandboxSpec(), settings, python=True)) is None  # asked for once
        wait_for(
            lambda: pool.stats.started >= 1 and pool.stats.stopped_idle >= 1 and pool.ready_count() == 0,
            timeout=120,
            what=lambda: f"the idle pool to shrink ({pool.stats})",
        )
    finally:
        pool.close()


def test_a_pool_that_cannot_start_sandboxes_leaves_jobs_to_start_their_own(pool_settings: Settings) -> None:
    root = pool_settings.workspaces / "not-a-dir"
    root.parent.mkdir(parents=True)
    root.write_text("")  # the pool's directories cannot be made under a file
    pool = SandboxPool(pool_settings, lambda: Demand(free_slots=1, queue_depth=1), root=root)
    try:
        held = _open(pool_settings, _job_workspace(pool_settings, "j", {"f": "x"}), pool)
        try:
            assert held.sandbox.call("bash", {"command": "cat f"}).output == "x"
        finally:
            held.finish()
        wait_for(lambda: pool.stats.start_failures >= 1, timeout=120, what="a failed refill")
        assert pool.ready_count() == 0
    finally:
        pool.close()


def test_a_failed_handoff_discards_the_sandbox_and_the_job_starts_its_own(pool_settings: Settings) -> None:
    """The pool's directories on another filesystem than the job's workspace: a rename cannot move them."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm for a second filesystem")
    other = Path(tempfile.mkdtemp(prefix="pool-", dir="/dev/shm"))
    pool = SandboxPool(pool_settings, lambda: Demand(free_slots=1, queue_depth=1), root=other)
    try:
        _learn(pool, pool_settings)
        ws = _job_workspace(pool_settings, "j", {"f": "kept"})
        held = _open(pool_settings, ws, pool)
        try:
            assert pool.stats.discarded == 1 and "cannot hand" in (pool.stats.last_discard or "")
            assert held.sandbox.workspace == ws.resolve()
            assert held.sandbox.call("bash", {"command": "cat f"}).output == "kept"
        finally:
            held.finish()
    finally:
        pool.close()
        shutil.rmtree(other, ignore_errors=True)


def test_a_burst_of_64_jobs_never_has_more_sandboxes_starting_than_the_cap(pool_settings: Settings) -> None:
    caps = {"sandbox_start_concurrency": 2, "sandbox_start_concurrency_per_image": 2}
    settings = pool_settings.model_copy(update=caps)
    reset_start_gate()
    pool = SandboxPool(settings, lambda: Demand(free_slots=8, queue_depth=64))  # refills pass the same gate
    errors: list[BaseException] = []

    def job(index: int) -> None:
        try:
            held = open_job_sandbox(
                SandboxSpec(),
                _job_workspace(settings, f"burst{index}", {}),
                settings,
                python=False,
                lifetime="single-use",
                pool=pool,
            )
            try:
                assert held.sandbox.call("bash", {"command": "echo ok"}).output == "ok\n"
            finally:
                held.finish()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=job, args=(i,)) for i in range(64)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        gate = start_gate(settings)
        assert not errors, errors[:3]
        assert gate.most_starting <= 2
        assert gate.waited > 0  # starts beyond the cap waited their turn; none failed
    finally:
        pool.close()
        reset_start_gate()


def test_directories_a_dead_worker_pool_left_are_swept(pool_settings: Settings) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    root = pool_settings.workspaces / ".pool"
    stale = root / f"{socket.gethostname()}-{gone.pid}-abc"
    live = root / f"{socket.gethostname()}-{os.getpid()}-def"
    elsewhere = root / f"another-node-{gone.pid}-abc"
    for path in (stale, live, elsewhere):
        (path / "left").mkdir(parents=True)
    pool = SandboxPool(pool_settings, lambda: Demand(free_slots=0, queue_depth=0), refill=False)
    try:
        assert not stale.exists()
        assert live.exists() and elsewhere.exists()
    finally:
        pool.close()


def test_a_stop_that_comes_while_the_job_s_own_sandbox_starts_stops_it(pool_settings: Settings) -> None:
    """A cancel during the start (it may wait for a turn under the cap) finds nothing started yet to stop;
    the start then stops what it started and says so, rather than leave it running."""
    held: list[JobSandbox] = []

    def cancelled_at_once(hold: JobSandbox) -> None:
        held.append(hold)
        hold.stop()

    ws = _job_workspace(pool_settings, "j", {})
    with pytest.raises(SandboxError, match="stopped while it started"):
        open_job_sandbox(
            SandboxSpec(), ws, pool_settings, python=True, lifetime="single-use", pool=None, hold=cancelled_at_once
        )
    assert not held[0].sandbox.running


def test_a_ready_sandbox_that_died_while_it_waited_is_never_handed_out(
    pool: SandboxPool, pool_settings: Settings
) -> None:
    profile = _learn(pool, pool_settings)
    dead = pool.ready(profile)[0]
    dead.stop()  # as if the OOM killer had taken it
    box = pool.take(profile)
    try:
        assert box is not dead and pool.stats.discarded == 1
    finally:
        if box is not None:
            box.stop()
