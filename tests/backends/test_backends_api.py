"""/v1/backends through the real app (create_app) on a real Redis: validation, auth, 404s, pool state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
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


def register(client: TestClient, **body: object) -> dict:
    response = client.post("/v1/backends", json={"url": "http://node1:8000", "model": "qwen", **body}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return response.json()


def test_register_list_get_heartbeat_drain_delete(client: TestClient, redis: Redis, api_settings: Settings) -> None:
    created = register(client, capacity=2, labels={"gpu": "h100"})
    assert created["healthy"] and not created["draining"] and created["inflight"] == 0
    assert register(client, capacity=4)["id"] == created["id"], "re-registering one URL is idempotent"
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
    for method, path in [("get", "/v1/backends/b-nope"), ("delete", "/v1/backends/b-nope"),
                         ("post", "/v1/backends/b-nope/heartbeat"), ("post", "/v1/backends/b-nope/drain")]:
        response = getattr(client, method)(path, headers=ADMIN)
        assert response.status_code == 404, (method, path)
        assert "b-nope" in response.json()["detail"]


@pytest.mark.parametrize(("body", "field"), [
    ({"url": "node1:8000", "model": "m"}, "url"),
    ({"url": "http://node1:8000", "model": ""}, "model"),
    ({"url": "http://node1:8000", "model": "m", "capacity": 0}, "capacity"),
    ({"url": "http://node1:8000", "model": "m", "id": "has space"}, "id"),
    ({"url": "http://node1:8000", "model": "m", "labels": {"k": 3}}, "labels"),
    ({"url": "http://node1:8000"}, "model"),
])
def test_bad_registration_is_422_naming_the_field(client: TestClient, body: dict, field: str) -> None:
    response = client.post("/v1/backends", json=body, headers=ADMIN)
    assert response.status_code == 422
    assert field in response.text


def test_auth_scopes(client: TestClient) -> None:
    body = {"url": "http://node1:8000", "model": "m"}
    assert client.post("/v1/backends", json=body).status_code == 401
    assert client.post("/v1/backends", json=body, headers=READER).status_code == 403
    assert client.get("/v1/backends").status_code == 401
    assert client.get("/v1/backends", headers=READER).status_code == 200
