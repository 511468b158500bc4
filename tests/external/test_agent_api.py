"""The API's side of external agents: the endpoint handed out at submit, the token checks, the job's state, forwarding."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from rollouts_client import Job
from shared.external_agent_tokens import CONVERSATION_HEADER, job_token
from shared.keys import Keys
from tests.external.conftest import SECRET, TOOLS, serve
from tests.support.scripted_llm import SCRIPTED_MODEL, ScriptedLLM

MATH = {"task": {"kind": "math", "problem": "What is 2 + 3?", "answer": "5"}, "agent": "external"}


@pytest.fixture()
def client(make_client) -> TestClient:
    return make_client(external_agent_secret=SECRET.decode())


def submit(client: TestClient, *jobs: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=list(jobs))
    assert response.status_code == 202, response.text
    return response.json()


def test_submit_hands_out_each_external_jobs_base_url_and_key(client: TestClient) -> None:
    body = submit(client, MATH, {"task": {"kind": "demo", "text": "abc"}})
    external, builtin = body["job_ids"]
    assert body["agent"][1] is None
    endpoint = body["agent"][0]
    assert endpoint["base_url"].endswith(f"/v1/jobs/{external}/agent")
    assert endpoint["api_key"] == job_token(SECRET, external) != job_token(SECRET, builtin)
    assert client.get(f"/v1/jobs/{external}").json()["agent"] == endpoint
    assert client.get(f"/v1/jobs/{builtin}").json().get("agent") is None
    typed = Job.from_api(client.get(f"/v1/jobs/{external}").json())  # the trainer's typed client reads it too
    assert typed.agent == endpoint and typed.failovers == {}
    assert "agent" not in submit(client, {"task": {"kind": "demo", "text": "x"}})


@pytest.mark.parametrize(
    "job",
    [
        {"task": {"kind": "demo", "text": "abc"}, "agent": "external"},
        {**MATH, "given": {"output": "5"}},
        {**MATH, "agent": "mine"},
    ],
)
def test_a_job_no_external_agent_can_drive_is_refused_naming_the_field(client: TestClient, job: dict[str, Any]) -> None:
    response = client.post("/v1/jobs", json=job)
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["body.agent"]


def test_keys_and_the_jobs_state_decide_before_anything_is_forwarded(client: TestClient, redis: Redis) -> None:
    one, two = submit(client, MATH, MATH)["job_ids"]
    url = f"/v1/jobs/{one}/agent/v1/chat/completions"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    assert client.post(url, json=body).status_code == 401
    other = client.post(url, json=body, headers={"Authorization": f"Bearer {job_token(SECRET, two)}"})
    assert other.status_code == 403 and other.json()["error"]["type"] == "permission_error"
    mine = {"Authorization": f"Bearer {job_token(SECRET, one)}"}
    waiting = client.post(url, json=body, headers=mine)  # queued: no worker serves it yet
    assert waiting.status_code == 503 and waiting.headers["retry-after"] == "1"
    assert client.delete(f"/v1/jobs/{one}").status_code == 200
    ended = client.post(url, json=body, headers=mine)
    assert ended.status_code == 409 and "cancelled" in ended.json()["error"]["message"]
    redis.hset(Keys().job(two), "status", "rollout")  # serving, but its worker is gone
    redis.set(Keys().external_agent_endpoint(two), "http://127.0.0.1:9")
    gone = client.post(
        f"/v1/jobs/{two}/agent/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {job_token(SECRET, two)}"},
    )
    assert gone.status_code == 503 and "cannot be reached" in gone.json()["error"]["message"]
    ghost = "0" * 32
    missing = client.get(
        f"/v1/jobs/{ghost}/agent/task", headers={"Authorization": f"Bearer {job_token(SECRET, ghost)}"}
    )
    assert missing.status_code == 404


def test_anthropic_calls_are_keyed_by_x_api_key_and_refused_in_anthropics_shape(
    client: TestClient, redis: Redis
) -> None:
    one, two = submit(client, MATH, MATH)["job_ids"]
    url = f"/v1/jobs/{one}/agent/v1/messages"
    body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    refusals = [
        (client.post(url, json=body), 401, "authentication_error"),
        (client.post(url, json=body, headers={"x-api-key": job_token(SECRET, two)}), 403, "permission_error"),
        (client.post(url, json=body, headers={"x-api-key": job_token(SECRET, one)}), 503, "overloaded_error"),
    ]
    for response, status, kind in refusals:
        assert response.status_code == status
        error = response.json()["error"]
        assert response.json() == {"type": "error", "error": {"type": kind, "message": error["message"]}}
    responses = client.post(
        f"/v1/jobs/{one}/agent/v1/responses",
        json={"model": "tiny", "input": "hi"},
        headers={"x-api-key": job_token(SECRET, two)},
    )
    assert responses.status_code == 403 and responses.json()["error"]["type"] == "permission_error", "OpenAI's shape"


@pytest.fixture()
def scripted(tokenizer: Any) -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM(tokenizer, scripts={"hi": ["Hello there."]}).start()
    yield llm
    llm.stop()


def test_a_serving_jobs_calls_are_forwarded_to_its_worker(
    client: TestClient, redis: Redis, tokenizer: Any, scripted: ScriptedLLM
) -> None:
    (job_id,) = submit(client, MATH)["job_ids"]
    keys = Keys()
    redis.hset(keys.job(job_id), "status", "rollout")  # as the rollout stage's take leaves it
    for endpoint in serve(tokenizer, scripted.url, SCRIPTED_MODEL, None, job_id=job_id):
        redis.set(keys.external_agent_endpoint(job_id), endpoint.url)  # as the rollout stage registers it
        base, headers = f"/v1/jobs/{job_id}/agent", {"Authorization": f"Bearer {endpoint.key}"}
        assert client.get(f"{base}/task", headers=headers).json()["tools"] == TOOLS
        body = {"model": SCRIPTED_MODEL, "messages": [{"role": "user", "content": "[script:hi]"}], "stream": True}
        streamed = client.post(f"{base}/v1/chat/completions", json=body, headers=headers)
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        assert streamed_content(streamed.text) == "Hello there."
        wrong = client.post(f"{base}/v1/chat/completions", json={**body, "model": "gpt-4o"}, headers=headers)
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "model", "the worker's refusal, as is"
        claude = {"model": SCRIPTED_MODEL, "max_tokens": 16, "messages": body["messages"], "stream": True}
        streamed = client.post(f"{base}/v1/messages", json=claude, headers={"x-api-key": endpoint.key})
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith('data: {"type": "message_stop"}')
        wrong = client.post(
            f"{base}/v1/messages", json={**claude, "max_tokens": 0}, headers={"x-api-key": endpoint.key}
        )
        assert wrong.status_code == 400 and wrong.json()["error"]["message"].startswith("max_tokens: ")
        answer = client.post(
            f"{base}/v1/responses", json={"model": SCRIPTED_MODEL, "input": "[script:hi]"}, headers=headers
        )
        assert answer.json()["output"][0]["content"][0]["text"] == "Hello there."
        named = client.post(
            f"{base}/v1/chat/completions",
            json={**body, "stream": False},
            headers={**headers, CONVERSATION_HEADER: "sub"},
        )
        assert named.status_code == 200 and endpoint.session.record().conversation == "sub", "the header reached it"
        assert client.post(f"{base}/finish", headers=headers).status_code == 200
        assert client.post(f"{base}/v1/chat/completions", json=body, headers=headers).status_code == 409
        assert len(endpoint.served) == 4
        redis.hset(keys.job(job_id), "status", "eval")
    assert client.get(f"/v1/jobs/{job_id}/agent/task", headers=headers).status_code == 409


def test_redis_away_is_a_503_not_a_500(make_client) -> None:
    from cli.embedded_redis import free_port

    client = make_client(external_agent_secret=SECRET.decode(), redis_url=f"redis://127.0.0.1:{free_port()}/0")
    job_id = "1" * 32
    response = client.post(
        f"/v1/jobs/{job_id}/agent/v1/chat/completions",
        json={},
        headers={"Authorization": f"Bearer {job_token(SECRET, job_id)}"},
    )
    assert response.status_code == 503 and "retry-after" in response.headers


def streamed_content(sse: str) -> str:
    """The content of a chat stream's chunks, joined (the endpoint streams it as the tokens come)."""
    chunks = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
