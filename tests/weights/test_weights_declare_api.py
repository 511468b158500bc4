"""Declaring a trainer's weight version without vLLM: who may, what it refuses, what it records, and that it
loads nothing (the backends are test doubles whose every weight route fails: one that is touched says so)."""

from __future__ import annotations

import pytest
from redis import Redis

from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.keys import Keys
from shared.weights import WeightVersions

ADMIN = {"Authorization": "Bearer admin-token"}
USER = {"Authorization": "Bearer user-token"}
TRAINER = {"owner": "trainer", "trainer": "skyrl", "run_id": "run-1"}


def register(redis: Redis, settings: Settings, url: str, model: str = "tiny") -> str:
    return BackendPool(redis, Keys(settings.redis_prefix), settings).register(url, model, labels=TRAINER).id


def declare(api, version: str, backends: list[str], model: str = "tiny", **extra: object):
    return api.post(f"/v1/models/{model}/weights/declare", json={"version": version, "backends": backends, **extra})


def test_only_an_admin_may_declare(make_client, redis: Redis, settings: Settings, doubles) -> None:
    backend_id = register(redis, settings, doubles().url)
    api = make_client(api_tokens=["user-token"], admin_tokens=["admin-token"])
    body = {"version": "step-1", "backends": [backend_id]}
    assert api.post("/v1/models/tiny/weights/declare", json=body).status_code == 401
    refused = api.post("/v1/models/tiny/weights/declare", json=body, headers=USER)
    assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    assert api.get("/v1/models/tiny/weights", headers=USER).json()["version"] is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"version": "step 1", "backends": ["b"]}, "body.version"),
        ({"version": "", "backends": ["b"]}, "body.version"),
        ({"version": "step-1", "backends": []}, "body.backends"),
        ({"version": "step-1"}, "body.backends"),
        ({"version": "step-1", "backends": ["no/slash"]}, "body.backends[0]"),
        ({"version": "step-1", "backends": ["b"], "owner": "a b"}, "body.owner"),
        ({"version": "step-1", "backends": ["b"], "path": "/x"}, "body.path"),
    ],
)
def test_bad_input_is_refused_naming_the_field(make_client, body: dict, field: str) -> None:
    response = make_client().post("/v1/models/tiny/weights/declare", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == field, response.json()


def test_an_unknown_backend_or_one_of_another_model_is_refused_and_nothing_is_recorded(
    make_client, redis: Redis, settings: Settings, doubles
) -> None:
    ours, other = register(redis, settings, doubles().url), register(redis, settings, doubles().url, "other")
    api = make_client()
    missing = declare(api, "step-1", [ours, "b-nosuchbackend"])
    assert missing.status_code == 404 and "body.backends" in missing.json()["detail"], missing.text
    assert "'b-nosuchbackend'" in missing.json()["detail"]
    wrong = declare(api, "step-1", [ours, other])
    assert wrong.status_code == 422 and wrong.json()["errors"][0]["field"] == "body.backends", wrong.text
    assert "'other'" in wrong.json()["errors"][0]["message"]
    assert api.get("/v1/models/tiny/weights").json()["version"] is None
    assert api.get(f"/v1/backends/{ours}").json()["weight_version"] == ""


def test_a_declaration_orders_the_version_labels_the_backends_and_loads_nothing(
    make_client, redis: Redis, settings: Settings, doubles
) -> None:
    doubles_ = [doubles(), doubles()]
    ids = [register(redis, settings, d.url) for d in doubles_]
    api = make_client()
    first = declare(api, "step-1", ids, owner="run-1")
    assert first.status_code == 200, first.text
    assert first.json() == {"model": "tiny", "version": "step-1", "seq": 1, "backends": ids}
    assert declare(api, "step-1", ids).json()["seq"] == 1  # a retry keeps its number
    assert declare(api, "step-2", ids[:1]).json()["seq"] == 2
    current = api.get("/v1/models/tiny/weights").json()
    assert current["version"] == "step-2" and current["seq"] == 2 and current["path"] == "trainer:trainer", current
    views = {i: api.get(f"/v1/backends/{i}").json() for i in ids}
    assert views[ids[0]]["weight_version"] == "step-2" and views[ids[1]]["weight_version"] == "step-1"
    assert all(v["healthy"] for v in views.values())
    assert not any(d.received.is_set() for d in doubles_)  # no weight route of any backend was called


def test_a_version_that_goes_backwards_is_refused_naming_the_version(
    make_client, redis: Redis, settings: Settings, doubles
) -> None:
    backend_id = register(redis, settings, doubles().url)
    api = make_client()
    for version in ("step-1", "step-2"):
        assert declare(api, version, [backend_id]).status_code == 200
    back = declare(api, "step-1", [backend_id])
    assert back.status_code == 422, back.text
    problem = back.json()["errors"][0]
    assert problem["field"] == "body.version" and "only move forward" in problem["message"], problem
    assert api.get(f"/v1/backends/{backend_id}").json()["weight_version"] == "step-2"


def test_a_trainer_owned_server_is_never_compared_with_or_loaded_with_the_services_weights(
    make_client, redis: Redis, settings: Settings, doubles
) -> None:
    """The model's current weights were loaded by the service; a trainer's server serving others joins healthy
    and untouched (its trainer loads its weights), while a service-owned one is registered stale."""
    WeightVersions(redis, Keys(settings.redis_prefix)).record("tiny", "v2", "/ckpt/v2")
    api = make_client()
    trainers, plain = doubles(weight_version="default"), doubles(weight_version="default")
    owned = api.post("/v1/backends", json={"url": trainers.url, "model": "tiny", "labels": TRAINER}).json()
    assert owned["healthy"] and owned["unhealthy_reason"] == "", owned
    service = api.post("/v1/backends", json={"url": plain.url, "model": "tiny"}).json()
    assert not service["healthy"] and service["unhealthy_reason"].startswith("stale weights"), service
    assert not trainers.received.is_set()


def test_once_a_trainer_declares_registration_compares_nothing_and_a_new_registration_clears_the_label(
    make_client, redis: Redis, settings: Settings, doubles
) -> None:
    api = make_client()
    double = doubles(weight_version="default")
    backend_id = register(redis, settings, double.url)
    assert declare(api, "step-3", [backend_id]).status_code == 200
    again = api.post("/v1/backends", json={"url": double.url, "model": "tiny"}).json()
    assert again["healthy"] and again["weight_version"] == "", again  # its start-up weights until declared again
    assert not double.received.is_set()
