"""The API's remembered route to a job's worker (api/external_agent/endpoint_cache.py) fails safe: real redis-server, real endpoints.

Each test first has the route remembered (a call through the API while its events subscription is
live), then changes the world under it: the job moves to another endpoint, is cancelled, the token is
wrong, the worker goes, the address answers for another job, the subscription drops.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.external_agent.endpoint_cache import EndpointCache
from shared.external_agent_tokens import job_token
from shared.keys import Keys
from tests.external.conftest import SECRET, Endpoint, serve
from tests.support.scripted_llm import SCRIPTED_MODEL, ScriptedLLM

MATH = {"task": {"kind": "math", "problem": "What is 2 + 3?", "answer": "5"}, "agent": "external"}
CHAT = {"model": SCRIPTED_MODEL, "messages": [{"role": "user", "content": "[script:hi]"}]}


@pytest.fixture()
def client(make_client) -> TestClient:
    return make_client(external_agent_secret=SECRET.decode())


@pytest.fixture()
def scripted(tokenizer: Any) -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM(tokenizer, scripts={"hi": ["Hello there."]}).start()
    yield llm
    llm.stop()


def serving_job(client: TestClient, redis: Redis) -> str:
    response = client.post("/v1/jobs", json=MATH)
    assert response.status_code == 202, response.text
    (job_id,) = response.json()["job_ids"]
    redis.hset(Keys().job(job_id), "status", "rollout")  # as the rollout stage's take leaves it
    return job_id


def register(redis: Redis, job_id: str, endpoint: Endpoint) -> None:
    """As the rollout stage registers a new attempt: the address, then the event."""
    redis.set(Keys().external_agent_endpoint(job_id), endpoint.url)
    redis.publish(Keys().job_events, f"{job_id} serving")


def routes(client: TestClient) -> EndpointCache:
    cache: EndpointCache = client.app.state.external_agent_routes  # type: ignore[attr-defined]
    return cache


def wait_for(condition: Any, what: str) -> None:
    for _ in range(1500):  # the events subscription runs on the API's loop: give it turns (a hang guard)
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


def chat(client: TestClient, job_id: str, key: str | None = None) -> Any:
    return client.post(
        f"/v1/jobs/{job_id}/agent/v1/chat/completions",
        json=CHAT,
        headers={"Authorization": f"Bearer {key or job_token(SECRET, job_id)}"},
    )


def remembered(client: TestClient, job_id: str, endpoint: Endpoint) -> None:
    """Calls until the API remembers the job's route (once its subscription is live)."""
    assert chat(client, job_id).status_code == 200
    wait_for(lambda: routes(client).live, "the API subscribed to the jobs' events")
    assert chat(client, job_id).status_code == 200
    assert routes(client).get(job_id) == endpoint.url


def remembered_endpoint(
    stack: ExitStack, client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM, job_id: str
) -> Endpoint:
    """The job's endpoint (stopped with `stack`), registered as its worker's address and remembered by the API."""
    (endpoint,) = endpoints(stack, tokenizer, scripted, job_id)
    register(redis, job_id, endpoint)
    remembered(client, job_id, endpoint)
    return endpoint


def endpoints(stack: ExitStack, tokenizer: Any, scripted: ScriptedLLM, *job_ids: str) -> list[Endpoint]:
    """Each job's endpoint served on a port of its own, as a rollout worker serves it (stopped with `stack`)."""
    return [
        stack.enter_context(contextmanager(serve)(tokenizer, scripted.url, SCRIPTED_MODEL, None, job_id=job_id))
        for job_id in job_ids
    ]


def test_a_job_restarted_elsewhere_is_followed_at_once(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    job_id = serving_job(client, redis)
    with ExitStack() as stack:
        first, second = endpoints(stack, tokenizer, scripted, job_id, job_id)
        register(redis, job_id, first)
        remembered(client, job_id, first)
        register(redis, job_id, second)  # the old attempt still serves: only the event moves the API
        wait_for(lambda: routes(client).get(job_id) is None, "the event dropped the old route")
        assert chat(client, job_id).status_code == 200
        assert (len(first.served), len(second.served)) == (2, 1)


def test_a_missed_move_fails_over_once_the_old_worker_is_gone(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    job_id = serving_job(client, redis)
    with ExitStack() as stack:
        (second,) = endpoints(stack, tokenizer, scripted, job_id)
        with ExitStack() as old:
            first = remembered_endpoint(old, client, redis, tokenizer, scripted, job_id)
        redis.set(
            Keys().external_agent_endpoint(job_id), second.url
        )  # no event: the API still remembers the old address
        assert routes(client).get(job_id) == first.url
        assert chat(client, job_id).status_code == 200  # refused connection: looked up again, sent to the new one
        assert len(second.served) == 1 and routes(client).get(job_id) == second.url


def test_an_address_now_answering_for_another_job_is_never_relayed(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    mine, other = serving_job(client, redis), serving_job(client, redis)
    with ExitStack() as stack:
        my_endpoint, other_endpoint = endpoints(stack, tokenizer, scripted, mine, other)
        register(redis, mine, my_endpoint)
        remembered(client, mine, my_endpoint)
        routes(client).put(mine, other_endpoint.url, routes(client).epoch)  # as if its port went to another job
        assert chat(client, mine).status_code == 200
        assert (len(my_endpoint.served), len(other_endpoint.served)) == (3, 0)
        assert routes(client).get(mine) == my_endpoint.url
        redis.set(Keys().external_agent_endpoint(mine), other_endpoint.url)  # Redis itself points at the wrong server
        routes(client).drop(mine)
        refused = chat(client, mine)
        assert refused.status_code == 503 and "answers for another" in refused.json()["error"]["message"]
        assert len(other_endpoint.served) == 0 and routes(client).get(mine) is None


def test_a_cancelled_job_is_refused_though_its_worker_still_serves(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    job_id = serving_job(client, redis)
    with ExitStack() as stack:
        endpoint = remembered_endpoint(stack, client, redis, tokenizer, scripted, job_id)
        assert client.delete(f"/v1/jobs/{job_id}").status_code == 200
        wait_for(lambda: routes(client).get(job_id) is None, "the cancel dropped the route")
        ended = chat(client, job_id)
        assert ended.status_code == 409 and "cancelled" in ended.json()["error"]["message"]
        assert len(endpoint.served) == 2


def test_a_wrong_key_is_refused_before_a_remembered_route_is_used(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    job_id, other = serving_job(client, redis), serving_job(client, redis)
    with ExitStack() as stack:
        endpoint = remembered_endpoint(stack, client, redis, tokenizer, scripted, job_id)
        assert chat(client, job_id, key=job_token(SECRET, other)).status_code == 403
        assert chat(client, job_id, key="rk-" + "0" * 64).status_code == 403
        assert client.post(f"/v1/jobs/{job_id}/agent/v1/chat/completions", json=CHAT).status_code == 401
        assert len(endpoint.served) == 2


def test_a_gone_worker_is_a_503_and_an_ended_job_a_409(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    job_id = serving_job(client, redis)
    with ExitStack() as stack:
        remembered_endpoint(stack, client, redis, tokenizer, scripted, job_id)
    gone = chat(client, job_id)  # the status still says rollout: the worker died without a word
    assert gone.status_code == 503 and "cannot be reached" in gone.json()["error"]["message"]
    assert routes(client).get(job_id) is None
    redis.hset(Keys().job(job_id), "status", "eval")
    assert chat(client, job_id).status_code == 409


def test_nothing_is_remembered_while_the_events_subscription_is_down(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    job_id = serving_job(client, redis)
    with ExitStack() as stack:
        endpoint = remembered_endpoint(stack, client, redis, tokenizer, scripted, job_id)
        redis.execute_command("CLIENT", "KILL", "TYPE", "pubsub")  # the API would miss a cancel now
        wait_for(lambda: routes(client).get(job_id) is None, "the lost subscription dropped every route")
        assert chat(client, job_id).status_code == 200  # served from a Redis lookup meanwhile
        wait_for(lambda: routes(client).live, "subscribed again")
        assert chat(client, job_id).status_code == 200
        assert routes(client).get(job_id) == endpoint.url


def test_a_superseded_attempts_409_is_not_the_jobs(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    job_id = serving_job(client, redis)
    with ExitStack() as stack:
        old = remembered_endpoint(stack, client, redis, tokenizer, scripted, job_id)
        old.session.end("superseded")  # its worker heard another attempt took the job; still up, refusing
        redis.delete(Keys().external_agent_endpoint(job_id))  # and unregistered; the new attempt has not registered yet
        waiting = chat(client, job_id)
        assert waiting.status_code == 503 and waiting.headers["retry-after"] == "1", waiting.text
        (new,) = endpoints(stack, tokenizer, scripted, job_id)
        redis.set(Keys().external_agent_endpoint(job_id), new.url)
        assert chat(client, job_id).status_code == 200 and len(new.served) == 1


def test_an_unexpected_failure_on_the_worker_is_its_502_relayed_once(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    job_id = serving_job(client, redis)
    with ExitStack() as stack:
        endpoint = remembered_endpoint(stack, client, redis, tokenizer, scripted, job_id)
        calls: list[Any] = []

        def failing_chat(
            call: Any, conversation: str | None = None
        ) -> Any:  # a test double: the session failing in a way it never planned for
            calls.append(call)
            raise RuntimeError("disk full")

        endpoint.session.chat = failing_chat  # type: ignore[method-assign]
        failed = chat(client, job_id)
        assert failed.status_code == 502 and "disk full" in failed.json()["error"]["message"]
        assert len(calls) == 1 and routes(client).get(job_id) == endpoint.url
