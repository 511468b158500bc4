"""rollouts_client against a live stack: jobs, batches, streaming, tensors, cancel, errors, retries."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from redis import Redis

from cli.stack import Stack
from rollouts_client import ApiError, AsyncRolloutClient, RetryPolicy, RolloutClient, WaitTimeout, groups_to_tensors
from tests.batches.live import start_stack
from tests.support.waiting import wait_for

INFORMATIVE = {"kind": "dapo_sim", "rewards": [1.0, 0.0, 0.5], "rollout_s": 0.1}
UNIFORM = {"kind": "dapo_sim", "reward": 0.0, "rollout_s": 0.1}
SLOW = {"kind": "dapo_sim", "rewards": [1.0, 0.0], "rollout_s": 60.0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(tmp_path_factory.mktemp("client-live"))
    yield stack
    stack.stop(timeout=10)


@pytest.fixture()
def client(stack: Stack) -> Iterator[RolloutClient]:
    with RolloutClient(stack.api_url) as client:
        yield client


def test_jobs_submit_wait_and_typed_results_in_msgpack_and_json(stack, client):
    ids = client.submit_jobs([{"task": INFORMATIVE, "sample_index": i} for i in range(3)])
    jobs = client.wait_jobs(ids, timeout=60)
    assert [j.status for j in jobs] == ["done"] * 3 and [j.reward for j in jobs] == [1.0, 0.0, 0.5]
    assert jobs[1].trajectory["token_ids"] == [1, 2, 3, 11, 11]
    with RolloutClient(stack.api_url, msgpack=False) as json_client:
        assert json_client.get_job(ids[1]).raw == client.get_job(ids[1]).raw


def test_jobs_are_listed_by_group_and_status_in_pages_sync_and_async(stack, client):
    group = "list-jobs-group"
    ids = client.submit_jobs([{"task": INFORMATIVE, "group_id": group, "sample_index": i} for i in range(3)])
    client.wait_jobs(ids, timeout=60)
    listed = client.list_jobs(group_id=group)
    assert sorted(j.id for j in listed) == sorted(ids)
    assert {j.status for j in listed} == {"done"} and sorted(j.reward for j in listed) == [0.0, 0.5, 1.0]
    assert len(client.list_jobs(group_id=group, limit=2)) == 2
    assert len(client.list_jobs(group_id=group, limit=2, offset=2)) == 1
    assert client.list_jobs(group_id=group, status="failed") == []

    async def listed_async() -> list[str]:
        async with AsyncRolloutClient(stack.api_url) as aclient:
            return [j.id for j in await aclient.list_jobs(group_id=group, status="done")]

    assert sorted(asyncio.run(listed_async())) == sorted(ids)
    with pytest.raises(ApiError) as refused:
        client.list_jobs(status="bogus")
    assert refused.value.status_code == 422


def test_waiting_times_out_and_a_running_job_can_be_cancelled(client):
    (job_id,) = client.submit_jobs({"task": SLOW})
    with pytest.raises(WaitTimeout):
        client.wait_jobs([job_id], timeout=0.5)
    assert client.cancel_job(job_id) is True
    assert client.cancel_job(job_id) is False
    assert client.wait_jobs([job_id], timeout=30)[0].status == "cancelled"


def test_a_refused_batch_raises_with_the_field_named(client):
    with pytest.raises(ApiError) as refused:
        client.submit_batch([INFORMATIVE], n_samples=0)
    assert refused.value.status_code == 422 and "n_samples" in str(refused.value)


def test_a_batch_becomes_padded_training_tensors_with_group_advantages(client):
    batch = client.submit_batch([INFORMATIVE, UNIFORM, INFORMATIVE], n_samples=3, min_informative_groups=2)
    groups = client.collect_groups(batch.id, results=True, timeout=120)
    assert [g.outcome for g in groups] == ["informative", "informative"]
    tensors = groups_to_tensors(groups, tensors="numpy")
    assert tensors["input_ids"].shape == (6, 6)  # prompt of 3 tokens + up to 3 generated
    np.testing.assert_array_equal(tensors["group_index"], [0, 0, 0, 1, 1, 1])
    np.testing.assert_allclose(tensors["rewards"], [1.0, 0.0, 0.5] * 2)
    expected = np.array([1.0, 0.0, 0.5]) - 0.5
    expected = expected / (np.std([1.0, 0.0, 0.5]) + 1e-6)
    np.testing.assert_allclose(tensors["advantages"], np.tile(expected, 2), rtol=1e-5)
    assert tensors["loss_mask"][1].tolist() == [0, 0, 0, 1, 1, 0]  # sample 1 generated two tokens
    # per-token rewards: each row's reward on its last generated token, nothing elsewhere
    for row in range(6):
        last = int(np.flatnonzero(tensors["loss_mask"][row])[-1])
        assert tensors["token_rewards"][row, last] == tensors["rewards"][row]
        assert np.count_nonzero(np.delete(tensors["token_rewards"][row], last)) == 0
    with pytest.raises(ValueError):
        groups_to_tensors(client.collect_groups(batch.id, results=False))


def test_async_client_streams_events_and_cancels_a_batch(stack):
    async def scenario() -> tuple[list, object, object]:
        async with AsyncRolloutClient(stack.api_url) as client:
            pool = [INFORMATIVE, SLOW, INFORMATIVE, SLOW]
            batch = await client.submit_batch(pool, n_samples=2, min_informative_groups=4, max_groups_in_flight=4)
            seen = []
            async for group in client.iter_events(batch.id, timeout=120):
                seen.append(group)
                if len(seen) == 2:
                    cancelled = await client.cancel_batch(batch.id)
            again = await client.cancel_batch(batch.id)
            return seen, cancelled, again

    seen, cancelled, again = asyncio.run(scenario())
    assert sorted(g.prompt_index for g in seen) == [0, 2]
    assert cancelled.status == "cancelled" and again is None


def test_closing_an_event_stream_ends_the_server_side_read(stack, client):
    batch = client.submit_batch([SLOW], n_samples=2, min_informative_groups=1)
    redis = Redis.from_url(stack.redis_url)

    def blocked_stream_reads() -> int:
        # Blocked now (flag b): an idle pooled connection keeps "xread" as its last command.
        return sum(1 for c in redis.client_list() if c.get("cmd") == "xread" and "b" in c.get("flags", ""))

    http = httpx.Client(base_url=stack.api_url, timeout=30)
    with http.stream("GET", f"/v1/batches/{batch.id}/events") as response:
        assert response.status_code == 200
        wait_for(lambda: blocked_stream_reads() >= 1, timeout=30, what="the SSE endpoint to wait on the stream")
    http.close()  # the connection is gone mid-stream, before any event
    wait_for(lambda: blocked_stream_reads() == 0, timeout=30, what="the server to stop reading for a gone client")
    client.cancel_batch(batch.id)
    redis.close()


def test_connection_errors_are_retried_until_the_api_is_back(stack):
    with RolloutClient(stack.api_url) as client:
        batch = client.submit_batch([INFORMATIVE], n_samples=2)
        assert stack.api is not None
        stack.api.terminate()
        stack.api.wait(timeout=15)
        restart = threading.Timer(0.5, stack.start_api)
        restart.start()
        # A budget (about 2 min) far above any API start-up: the test is about retrying, not speed.
        patient = RolloutClient(stack.api_url, retry=RetryPolicy(retries=120, first_delay_s=0.2, max_delay_s=1.0))
        with patient:
            assert patient.get_batch(batch.id).id == batch.id
        restart.join()
