"""/v1/backends through the real app (create_app) on a real Redis and the session's real vLLM server:
registration checks what the server serves; validation, auth, 404s, pool state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from cli.embedded_redis import free_port
from cli.vllm_server import VLLMServer
from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.keys import Keys

ADMIN = {"Authorization": "Bearer admin-token"}
READER = {"Authorization": "Bearer reader-token"}


@pytest.fixture()
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_tokens": ["reader-token"], "admin_tokens": ["admin-token"]})


@pytest.fixture()
def client(api_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(api_settings)) as c:
        yield c


def register(client: TestClient, url: str, **body: object) -> dict:
    response = client.post("/v1/backends", json={"url": url, "model": "tiny", **body}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return response.json()


@pytest.mark.vllm
def test_register_list_get_heartbeat_drain_delete(
    client: TestClient, redis: Redis, api_settings: Settings, vllm_server: VLLMServer
) -> None:
    created = register(client, vllm_server.url, capacity=2, labels={"gpu": "h100"})
    assert created["healthy"] and not created["draining"] and created["inflight"] == 0
    assert created["tokenizer"] == str(vllm_server.model), "the model's path vLLM reports is its tokenizer"
    assert register(client, vllm_server.url, capacity=4)["id"] == created["id"], "re-registering one URL is idempotent"
    backend_id = created["id"]

    pool = BackendPool(redis, Keys(api_settings.redis_prefix), api_settings)
    pool.acquire("job-1")  # a rollout worker pins a trajectory
    listed = client.get("/v1/backends", headers=READER).json()
    assert listed["inflight"] == 1 and listed["selectable"] == 1
    assert listed["backends"][0]["capacity"] == 4 and listed["backends"][0]["inflight"] == 1

    assert client.get(f"/v1/backends/{backend_id}", headers=READER).json()["id"] == backend_id
    assert client.post(f"/v1/backends/{backend_id}/heartbeat", headers=ADMIN).status_code == 200
    drained = client.post(f"/v1/backends/{backend_id}/drain", headers=ADMIN).json()
    assert drained["draining"] and client.get("/v1/backends", headers=READER).json()["selectable"] == 0
    reopened = client.post(f"/v1/backends/{backend_id}/drain", json={"draining": False}, headers=ADMIN).json()
    assert not reopened["draining"]
    assert client.delete(f"/v1/backends/{backend_id}", headers=ADMIN).status_code == 204
    assert client.get("/v1/backends", headers=READER).json()["backends"] == []


def test_unknown_id_is_404_everywhere(client: TestClient) -> None:
    for method, path in [
        ("get", "/v1/backends/b-nope"),
        ("delete", "/v1/backends/b-nope"),
        ("post", "/v1/backends/b-nope/heartbeat"),
        ("post", "/v1/backends/b-nope/drain"),
    ]:
        response = getattr(client, method)(path, headers=ADMIN)
        assert response.status_code == 404, (method, path)
        assert "b-nope" in response.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "node1:8000", "model": "m"}, "url"),
        ({"url": "http://node1:8000", "model": ""}, "model"),
        ({"url": "http://node1:8000", "model": "m", "capacity": 0}, "capacity"),
        ({"url": "http://node1:8000", "model": "m", "id": "has space"}, "id"),
        ({"url": "http://node1:8000", "model": "m", "labels": {"k": 3}}, "labels"),
        ({"url": "http://node1:8000"}, "model"),
    ],
)
def test_bad_registration_is_422_naming_the_field(client: TestClient, body: dict, field: str) -> None:
    response = client.post("/v1/backends", json=body, headers=ADMIN)
    assert response.status_code == 422
    assert field in response.text


@pytest.mark.vllm
def test_a_model_the_server_does_not_serve_is_refused_naming_what_it_serves(
    client: TestClient, vllm_server: VLLMServer
) -> None:
    response = client.post("/v1/backends", json={"url": vllm_server.url, "model": "llama-70b"}, headers=ADMIN)
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["field"] == "body.model" and "['tiny']" in error["message"] and "llama-70b" in error["message"]


def test_a_url_that_is_not_a_model_server_is_refused(client: TestClient, api_settings: Settings) -> None:
    for url in (f"http://127.0.0.1:{free_port()}", "http://127.0.0.1:1"):  # nothing listens there
        response = client.post("/v1/backends", json={"url": url, "model": "tiny"}, headers=ADMIN)
        assert response.status_code == 422
        [error] = response.json()["errors"]
        assert error["field"] == "body.url" and url in error["message"] and "/v1/models" in error["message"]
    # The API itself answers /v1/models with 404: a server, but not an OpenAI-compatible one.
    with TestClient(create_app(api_settings)) as other:
        assert other.get("/v1/models").status_code == 404


def test_auth_scopes(client: TestClient) -> None:
    body = {"url": "http://node1:8000", "model": "m"}
    assert client.post("/v1/backends", json=body).status_code == 401
    assert client.post("/v1/backends", json=body, headers=READER).status_code == 403
    assert client.get("/v1/backends").status_code == 401
    assert client.get("/v1/backends", headers=READER).status_code == 200
