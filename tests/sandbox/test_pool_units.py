"""The pool's pure parts: how many ready sandboxes it wants, its profile key, and the start gate's count."""

from __future__ import annotations

import threading

import pytest

from shared.config import Settings
from tests.support.waiting import wait_for
from workers.sandbox.pool_sizing import Asked, Demand, targets, wanted_total
from workers.sandbox.profile import SandboxProfile
from workers.sandbox.spec import SandboxLimits, SandboxSpec
from workers.sandbox.start_gate import StartGate


def test_wanted_follows_free_slots_and_queue_depth() -> None:
    assert wanted_total(Demand(free_slots=8, queue_depth=0)) == 1  # one ready while a profile is in use
    assert wanted_total(Demand(free_slots=8, queue_depth=3)) == 3
    assert wanted_total(Demand(free_slots=2, queue_depth=50)) == 3  # and one for the next slot to free
    assert wanted_total(Demand(free_slots=0, queue_depth=0)) == 1


def test_idle_profiles_want_none_and_the_bound_caps_all() -> None:
    asked = {"old": Asked(last=0.0, count=9), "a": Asked(last=95.0, count=3), "b": Asked(last=99.0, count=1)}
    wanted = targets(asked, Demand(free_slots=32, queue_depth=32), now=100.0, idle_s=10.0, max_ready=100)
    assert wanted["old"] == 0
    assert wanted["a"] == 24 and wanted["b"] == 8  # shared by how often each was asked for
    capped = targets(asked, Demand(free_slots=32, queue_depth=32), now=100.0, idle_s=10.0, max_ready=5)
    assert sum(capped.values()) <= 5 and capped["b"] >= 1  # the most recent first
    assert targets(asked, Demand(1, 1), now=1000.0, idle_s=10.0, max_ready=5) == {"old": 0, "a": 0, "b": 0}


def test_a_profile_is_what_is_fixed_at_start_not_the_jobs_files() -> None:
    settings = Settings(sandbox_memory_bytes=2 * 1024**3)
    plain = SandboxProfile.of(SandboxSpec(files={"a.py": "x"}, setup=["make"]), settings, python=True)
    assert plain == SandboxProfile.of(SandboxSpec(), settings, python=True)
    same_limit = SandboxSpec(limits=SandboxLimits(memory_bytes=2 * 1024**3))
    assert SandboxProfile.of(same_limit, settings, python=True) == plain  # the default and its value
    assert SandboxProfile.of(SandboxSpec(network=True), settings, python=True) != plain
    assert SandboxProfile.of(SandboxSpec(env={"A": "1"}), settings, python=True) != plain
    assert SandboxProfile.of(SandboxSpec(), settings, python=False) != plain
    assert SandboxProfile.of(plain.spec(), settings, python=True) == plain


@pytest.mark.parametrize("per_image", [1, 3])
def test_the_gate_holds_starts_to_the_cap_and_waits_rather_than_fails(per_image: int) -> None:
    gate = StartGate(total=2, per_image=per_image)
    inside = threading.Semaphore(0)
    release = threading.Event()

    def start(image: str) -> None:
        with gate.turn(image):
            inside.release()
            release.wait()

    threads = [threading.Thread(target=start, args=(f"img{i % 2}",)) for i in range(10)]
    for thread in threads:
        thread.start()
    for _ in range(min(2, 2 * per_image)):
        inside.acquire()  # as many as the caps let in are inside; the rest wait
    assert gate.starting == min(2, 2 * per_image)
    wait_for(lambda: gate.waited >= 8, what="the other starts to be waiting")
    assert gate.starting == min(2, 2 * per_image)
    release.set()
    for thread in threads:
        thread.join()
    assert gate.most_starting <= min(2, 2 * per_image)
    assert gate.starting == 0


def test_a_jobs_start_goes_before_the_pools_refills() -> None:
    """With every turn taken, a refill waiting first still lets a job's start (waiting later) in first; a refill
    of another image whose turn no waiting job could take goes ahead."""
    gate = StartGate(total=2, per_image=1)
    order: list[str] = []
    hold_a, entered_a = threading.Event(), threading.Event()

    def holder() -> None:
        with gate.turn("a"):
            entered_a.set()
            hold_a.wait()

    def start(name: str, image: str, spare: bool) -> None:
        with gate.turn(image, spare):
            order.append(name)

    first = threading.Thread(target=holder)
    first.start()
    entered_a.wait()
    refill = threading.Thread(target=start, args=("refill", "a", True))
    refill.start()
    wait_for(lambda: gate.waited >= 1, what="the refill to wait")
    job = threading.Thread(target=start, args=("job", "a", False))
    job.start()
    wait_for(lambda: gate.waited >= 2, what="the job to wait")
    start("other image", "b", True)  # a turn no waiting job can take: image a is at its cap
    hold_a.set()
    for thread in (first, refill, job):
        thread.join()
    assert order == ["other image", "job", "refill"]
    assert gate.starting == 0
