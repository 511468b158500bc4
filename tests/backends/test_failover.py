"""A backend process killed mid-request: the trajectory re-pins and goes on; counts stay exact."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from redis import Redis

from cli.vllm_server import VLLMServer
from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.keys import Keys
from tests.support.vllm_server import LOG_REQUESTS, freeze, kill_server, requests_taken
from tests.support.waiting import wait_for
from workers.rollout.llm_client import LLMClient
from workers.rollout.llm_completion import Sampling
from workers.rollout.llm_routing import complete_routed


def test_killed_backend_fails_over_and_the_trajectory_goes_on(
    start_backends: Callable[[int], list[VLLMServer]],
    vllm_server: VLLMServer,
    redis: Redis,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    own = start_backends(1, LOG_REQUESTS)[0]  # the one to kill: the session's server must live on
    pool = BackendPool(redis, Keys(settings.redis_prefix), settings)
    by_id = {pool.register(own.url, "tiny").id: own}
    sampling = Sampling(max_tokens=6, seed=11, ignore_eos=True)
    prompt = [257, 117, 115, 101, 114, 10, 104, 105, 258, 10, 257, 97, 10]

    with LLMClient(request_timeout_s=60, connect_timeout_s=1, max_retries=1, backoff_s=0.01) as client:
        turns = [complete_routed(pool, client, "job-1", prompt, sampling) for _ in range(2)]
        first_backend = turns[0].backend_id
        assert turns[1].backend_id == first_backend, "sticky: every call of a trajectory hits one backend"
        assert pool.get(first_backend).inflight == 1
        by_id[pool.register(vllm_server.url, "tiny").id] = vllm_server  # the survivor joins

        # Turn 3 reaches the pinned backend while its scheduler is paused (vLLM's own /pause, mode keep:
        # the request is accepted and queued, and no token of it is sampled), so it is certainly mid-request,
        # however fast the machine generates, when the backend is killed.
        victim = by_id[first_backend]
        freeze(victim)
        taken = requests_taken(victim)
        history = prompt + turns[1].token_ids + [10, 257, 117, 10]
        third = Sampling(max_tokens=40, seed=11, ignore_eos=True)
        with ThreadPoolExecutor(1) as executor:
            pending = executor.submit(complete_routed, pool, client, "job-1", history, third)
            wait_for(lambda: requests_taken(victim) > taken, timeout=60, what="the paused backend to take turn 3")
            kill_server(victim)
            after = pending.result(timeout=120)

    assert after.backend_id != first_backend
    assert len(after.token_ids) == 40 and after.prompt_tokens == len(history)
    # The first failed attempt on the killed backend (the client retries it once) lost a response mid-way.
    failures = [r.getMessage() for r in caplog.records if first_backend in r.getMessage()]
    assert failures and "ConnectError" not in failures[0], f"the kill must land mid-request: {failures}"
    dead = pool.get(first_backend)
    assert not dead.healthy and "probe failed" in dead.unhealthy_reason
    assert dead.inflight == 0 and pool.get(after.backend_id).inflight == 1, "the charge moved with the pin"
    assert pool.acquire("job-1").backend_id == after.backend_id
    pool.release("job-1")
    assert pool.inflight_total() == 0


def test_a_passing_probe_brings_a_backend_back(vllm_server: VLLMServer, redis: Redis, settings: Settings) -> None:
    pool = BackendPool(redis, Keys(settings.redis_prefix), settings)
    backend = pool.register(vllm_server.url, "tiny")
    pool.set_health(backend.id, False, "probe failed: earlier outage")
    report = pool.maintain(probe=True)
    assert report.recovered == [backend.id] and pool.get(backend.id).healthy
    assert pool.acquire("job-1").backend_id == backend.id
