"""The backend pool against a real redis-server: atomic selection, stickiness, spread, health."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
from redis import Redis

from shared.backend_pool import BackendPool, NoBackendAvailable, backend_id_for
from shared.config import Settings
from shared.keys import Keys


def make_pool(redis_url: str, settings: Settings, **overrides: object) -> BackendPool:
    merged = settings.model_copy(update=overrides)
    return BackendPool(Redis.from_url(redis_url), Keys(merged.redis_prefix), merged)


@pytest.fixture()
def pool(redis_url: str, settings: Settings) -> BackendPool:
    return make_pool(redis_url, settings)


def register_n(pool: BackendPool, n: int, capacity: float = 1.0) -> list[str]:
    return [pool.register(f"http://10.0.0.{i}:8000", "m", capacity=capacity).id for i in range(n)]


def counts(pool: BackendPool) -> dict[str, int]:
    return {b.id: b.inflight for b in pool.backends()}


def test_register_is_idempotent_per_url_and_lists_state(pool: BackendPool) -> None:
    first = pool.register("http://h:1/", "tiny", capacity=2, labels={"gpu": "h100"})
    again = pool.register("http://h:1", "tiny-v2", capacity=3)
    assert first.id == again.id == backend_id_for("http://h:1")
    [listed] = pool.backends()
    assert (listed.url, listed.model, listed.capacity) == ("http://h:1", "tiny-v2", 3.0)
    assert listed.healthy and not listed.draining and listed.inflight == 0
    pool.drain(listed.id)
    assert pool.register("http://h:1", "tiny-v2", capacity=3).draining, "re-registering keeps a drain"
    assert pool.deregister(listed.id) is True
    assert pool.backends() == [] and pool.get(listed.id) is None
    assert pool.deregister(listed.id) is False
    # A beat, drain or health change racing a deregistration must not resurrect the backend.
    assert not pool.heartbeat(listed.id) and not pool.drain(listed.id) and not pool.set_health(listed.id, False)
    assert not pool.redis.exists(pool.keys.backend(listed.id))


def test_no_backend_raises(pool: BackendPool) -> None:
    with pytest.raises(NoBackendAvailable):
        pool.acquire("job-1")


def test_every_call_of_a_trajectory_hits_one_backend(pool: BackendPool) -> None:
    register_n(pool, 4)
    pins = {pool.acquire("job-1").backend_id for _ in range(20)}
    assert len(pins) == 1
    assert sum(counts(pool).values()) == 1, "repeat calls of one trajectory must not count twice"
    # Other trajectories spread onto the other backends instead of piling on the pinned one.
    others = {pool.acquire(f"job-{i}").backend_id for i in range(2, 5)}
    assert len(others | pins) == 4
    for i in range(1, 5):
        assert pool.release(f"job-{i}")
    assert not pool.release("job-1"), "release is idempotent"
    assert set(counts(pool).values()) == {0}
    assert pool.redis.hlen(pool.keys.llm_routes) == 0


def test_concurrent_acquire_and_release_never_double_count(redis_url: str, settings: Settings) -> None:
    ids = register_n(make_pool(redis_url, settings), 8)
    threads, per_thread = 12, 150
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []
    seen: dict[str, set[str]] = {}

    def worker(t: int, phase: str) -> None:
        pool = make_pool(redis_url, settings)  # one connection per thread, like separate workers
        try:
            barrier.wait()
            for i in range(per_thread):
                job = f"job-{t}-{i}"
                if phase == "acquire":
                    seen[job] = {pool.acquire(job).backend_id for _ in range(3)}
                else:
                    assert pool.release(job)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    for phase in ("acquire", "release"):
        workers = [threading.Thread(target=worker, args=(t, phase)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors, errors
        pool = make_pool(redis_url, settings)
        if phase == "acquire":
            by_backend = counts(pool)
            assert sum(by_backend.values()) == threads * per_thread
            # Atomic pick-min-and-increment keeps equal-capacity backends within one of each other.
            assert max(by_backend.values()) - min(by_backend.values()) <= 1
            assert all(len(s) == 1 for s in seen.values())
            assert pool.reconcile() == 0, "counts must equal the recount from charges"
    assert counts(pool) == {i: 0 for i in ids}
    for key in (pool.keys.llm_routes, pool.keys.llm_route_refs, pool.keys.llm_charges, pool.keys.llm_lease_routes):
        assert pool.redis.hlen(key) == 0
    assert pool.redis.zcard(pool.keys.llm_leases) == 0


def test_fair_spread_over_16_weighted_backends(pool: BackendPool) -> None:
    weights = [1, 2, 4, 1] * 4
    ids = [pool.register(f"http://10.0.1.{i}:8000", "m", capacity=w).id for i, w in enumerate(weights)]
    pins = 10_000
    for i in range(pins):
        pool.acquire(f"job-{i}")
    by_backend = counts(pool)
    assert sum(by_backend.values()) == pins
    per_weight = [by_backend[b] / w for b, w in zip(ids, weights)]
    mean = statistics.mean(per_weight)
    assert max(per_weight) <= mean * 1.10 and min(per_weight) >= mean * 0.90
    expected = [pins * w / sum(weights) for w in weights]
    for b, want in zip(ids, expected):
        assert abs(by_backend[b] - want) <= want * 0.10


def test_drain_stops_new_pins_but_existing_ones_finish(pool: BackendPool) -> None:
    a, b = register_n(pool, 2)
    first = pool.acquire("job-1").backend_id
    assert pool.drain(first)
    assert pool.acquire("job-1").backend_id == first, "a pinned trajectory stays on a draining backend"
    other = a if first == b else b
    assert {pool.acquire(f"new-{i}").backend_id for i in range(5)} == {other}
    pool.drain(other)
    with pytest.raises(NoBackendAvailable):
        pool.acquire("late-job")
    pool.release("job-1")
    assert pool.get(first).inflight == 0 and pool.get(first).draining
    assert pool.drain(first, draining=False)
    assert pool.acquire("late-job").backend_id == first


def test_unhealthy_backend_repins_and_moves_the_charge(pool: BackendPool) -> None:
    register_n(pool, 3)
    pin = pool.acquire("job-1")
    assert pool.set_health(pin.backend_id, False, "test")
    moved = pool.acquire("job-1")
    assert moved.repinned and moved.backend_id != pin.backend_id
    assert counts(pool)[pin.backend_id] == 0 and counts(pool)[moved.backend_id] == 1
    assert pool.acquire("job-1").backend_id == moved.backend_id and not pool.acquire("job-1").repinned
    pool.release("job-1")
    assert sum(counts(pool).values()) == 0


def test_a_pinned_backend_past_the_load_ceiling_yields_new_trajectories(redis_url: str, settings: Settings) -> None:
    pool = make_pool(redis_url, settings, llm_pin_per_group=True, llm_load_ceiling=2.0)
    register_n(pool, 2)
    first = [pool.acquire(f"job-{i}", group_id="g1").backend_id for i in range(3)]
    assert len(set(first)) == 1, "within the ceiling the group shares its pin (and prefix cache)"
    fourth = pool.acquire("job-3", group_id="g1").backend_id
    assert fourth != first[0], "3 ahead of an idle backend, past a ceiling of 2: the next sample goes there"
    assert [pool.acquire(f"job-{i}", group_id="g1").backend_id for i in range(3)] == first, "running ones stay"
    assert sorted(counts(pool).values()) == [1, 3]


def test_deregistered_backend_repins_without_negative_counts(pool: BackendPool) -> None:
    register_n(pool, 2)
    pin = pool.acquire("job-1")
    pool.deregister(pin.backend_id)
    assert pool.acquire("job-1").backend_id != pin.backend_id
    pool.release("job-1")
    assert list(counts(pool).values()) == [0]


def test_group_pinning_counts_each_trajectory(redis_url: str, settings: Settings) -> None:
    pool = make_pool(redis_url, settings, llm_pin_per_group=True)
    register_n(pool, 4)
    pins = {pool.acquire(f"job-{i}", group_id="g1").backend_id for i in range(4) for _ in range(2)}
    assert len(pins) == 1
    [backend] = pins
    assert counts(pool)[backend] == 4
    assert pool.acquire("job-9", group_id="g2").backend_id != backend, "the next group goes elsewhere"
    for i in range(3):
        pool.release(f"job-{i}")
    assert counts(pool)[backend] == 1
    assert pool.acquire("job-3", group_id="g1").backend_id == backend, "the pin outlives partial release"
    pool.release("job-3")
    assert counts(pool)[backend] == 0
    assert pool.redis.hget(pool.keys.llm_routes, "g:g1") is None


def test_group_repin_moves_each_trajectory_once(redis_url: str, settings: Settings) -> None:
    pool = make_pool(redis_url, settings, llm_pin_per_group=True)
    register_n(pool, 2)
    first = {pool.acquire(f"job-{i}", group_id="g").backend_id for i in range(3)}.pop()
    pool.set_health(first, False, "gone")
    second = pool.acquire("job-0", group_id="g").backend_id
    assert second != first
    # Not yet called again: job-1 and job-2 are still charged to the old backend.
    assert counts(pool) == {first: 2, second: 1}
    for i in (1, 2):
        assert pool.acquire(f"job-{i}", group_id="g").backend_id == second
    assert counts(pool) == {first: 0, second: 3}


def test_crashed_rollout_lease_is_reaped(pool: BackendPool) -> None:
    register_n(pool, 2)
    pool.acquire("crashed")
    pool.acquire("alive")
    later = time.time() + pool.settings.llm_pin_ttl_s + 1
    pool.redis.zadd(pool.keys.llm_leases, {"alive": later + 100})  # as if it kept calling acquire/touch
    assert pool.reap_expired(now=later) == 1
    assert sum(counts(pool).values()) == 1
    assert pool.redis.hget(pool.keys.llm_charges, "crashed") is None
    assert pool.touch("alive") and not pool.touch("crashed")


def test_reconcile_corrects_a_corrupted_count(pool: BackendPool) -> None:
    [b] = register_n(pool, 1)
    pool.acquire("job-1")
    pool.redis.hset(pool.keys.backend_inflight, b, 7)
    assert pool.reconcile() == 1
    assert pool.get(b).inflight == 1
    assert pool.redis.zscore(pool.keys.backend_load, b) == 1.0


def test_missed_heartbeats_leave_the_pool_and_a_beat_brings_it_back(pool: BackendPool) -> None:
    a, b = register_n(pool, 2)
    pool.redis.hset(pool.keys.backend(a), "last_heartbeat", time.time() - 3600)
    report = pool.maintain(probe=False)
    assert report.missed_heartbeats == [a]
    assert not pool.get(a).healthy and "missed heartbeats" in pool.get(a).unhealthy_reason
    assert {pool.acquire(f"j{i}").backend_id for i in range(3)} == {b}
    assert pool.heartbeat(a) and pool.get(a).healthy
    assert not pool.heartbeat("b-unknown")


def test_probe_failure_marks_unhealthy(pool: BackendPool) -> None:
    from cli.embedded_redis import free_port

    dead = pool.register(f"http://127.0.0.1:{free_port()}", "m")  # nothing listens there
    report = pool.maintain(probe=True)
    assert report.failed_probes == [dead.id]
    assert "probe failed" in pool.get(dead.id).unhealthy_reason
    assert pool.report_failure(dead.id, "connect error") is False


def test_new_group_member_is_not_charged_to_a_draining_pin(redis_url: str, settings: Settings) -> None:
    """Drain closes a backend to new trajectories, group members included; running ones stay."""
    pool = make_pool(redis_url, settings, llm_pin_per_group=True)
    register_n(pool, 2)
    first = {pool.acquire(f"job-{i}", group_id="g").backend_id for i in range(2)}.pop()
    pool.drain(first)
    joiner = pool.acquire("job-new", group_id="g")
    assert joiner.backend_id != first and not joiner.repinned, "a new member was never on the drained one"
    for i in range(2):
        stay = pool.acquire(f"job-{i}", group_id="g")
        assert stay.backend_id == first and not stay.repinned, "running members finish on the draining backend"
    assert pool.acquire("job-later", group_id="g").backend_id == joiner.backend_id, "later members follow the pin"
    assert counts(pool) == {first: 2, joiner.backend_id: 2}


def test_new_group_member_is_not_charged_to_an_unhealthy_pin(redis_url: str, settings: Settings) -> None:
    pool = make_pool(redis_url, settings, llm_pin_per_group=True)
    register_n(pool, 2)
    first = pool.acquire("job-0", group_id="g").backend_id
    pool.set_health(first, False, "gone")
    joiner = pool.acquire("job-new", group_id="g")
    assert joiner.backend_id != first and not joiner.repinned
    moved = pool.acquire("job-0", group_id="g")
    assert moved.backend_id == joiner.backend_id and moved.repinned, "a member moving off a dead backend re-pinned"
    assert pool.get(first).inflight == 0


def test_excluded_backend_is_avoided_for_the_call_and_the_route_moves(pool: BackendPool) -> None:
    ids = register_n(pool, 3)
    pin = pool.acquire("job-1")
    moved = pool.acquire("job-1", exclude=[pin.backend_id])
    assert moved.backend_id != pin.backend_id and moved.repinned
    assert pool.acquire("job-1").backend_id == moved.backend_id, "the pin stays moved"
    others = [b for b in ids if b not in (pin.backend_id, moved.backend_id)]
    assert pool.acquire("job-1", exclude=[pin.backend_id, moved.backend_id]).backend_id == others[0]
    with pytest.raises(NoBackendAvailable):
        pool.acquire("job-1", exclude=ids)
    assert sum(counts(pool).values()) == 1


def test_backend_deregistered_during_acquire_is_repicked(pool: BackendPool) -> None:
    """deregister() deletes the registration, then syncs the selection sets: a pick in between is redone."""
    doomed, survivor = register_n(pool, 2)
    pool.drain(survivor)  # the first pick must be the doomed one
    pool.redis.delete(pool.keys.backend(doomed))  # half-way through deregister(): not yet synced
    real_script = pool._acquire
    calls: list[int] = []

    def racing_script(**kwargs: object):  # type: ignore[no-untyped-def]
        if calls:
            pool.drain(survivor, draining=False)
        calls.append(1)
        return real_script(**kwargs)

    pool._acquire = racing_script  # type: ignore[method-assign]
    pin = pool.acquire("job-1")
    assert pin.backend_id == survivor and pin.url == "http://10.0.0.1:8000" and len(calls) == 2
    assert counts(pool) == {survivor: 1}


def test_a_re_registration_reaches_the_next_pick_at_once(pool: BackendPool) -> None:
    """A server restarted with another model's tokenizer under the same id: no worker keeps the old one."""
    [backend_id] = register_n(pool, 1)
    assert pool.acquire("job-1").tokenizer == ""
    backend = pool.get(backend_id)
    pool.register(backend.url, backend.model, tokenizer="/models/other")
    assert pool.acquire("job-1").tokenizer == "/models/other"


def test_a_backend_serving_another_model_stays_out_until_it_registers_again(pool: BackendPool, monkeypatch) -> None:
    """Its /health passes, so a probe must not bring it back: only a registration says what it serves."""
    from shared import backend_pool

    [backend_id] = register_n(pool, 1)
    monkeypatch.setattr(backend_pool, "probe_health", lambda url, timeout_s, key=None: None)
    pool.set_health(backend_id, False, f"{backend_pool.NOT_SERVING_MODEL} 'm'")
    pool.maintain(probe=True)
    assert not pool.get(backend_id).healthy
    pool.register("http://10.0.0.0:8000", "m2")
    assert pool.get(backend_id).healthy and pool.get(backend_id).model == "m2"
