"""The weights route without vLLM: who may call it, what it refuses before touching a backend, the
per-model lock, and a backend whose update fails leaving the pool for good (a test double that errors)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from redis import Redis

from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.keys import Keys
from shared.weights import WeightVersions

ADMIN = {"Authorization": "Bearer admin-token"}
USER = {"Authorization": "Bearer user-token"}


def register(redis: Redis, settings: Settings, url: str) -> str:
    return BackendPool(redis, Keys(settings.redis_prefix), settings).register(url, "tiny").id


def test_only_an_admin_may_update_weights(make_client, checkpoint: Path) -> None:
    api = make_client(api_tokens=["user-token"], admin_tokens=["admin-token"])
    body = {"version": "v1", "path": str(checkpoint)}
    assert api.post("/v1/models/tiny/weights", json=body).status_code == 401
    refused = api.post("/v1/models/tiny/weights", json=body, headers=USER)
    assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    assert api.get("/v1/models/tiny/weights", headers=USER).json()["version"] is None  # reading is for everyone
    assert api.post("/v1/models/tiny/weights", json=body, headers=ADMIN).status_code == 404  # no backend of tiny
    missing = api.post("/v1/models/org/model-7b/weights", json=body, headers=ADMIN)  # served names may hold '/'
    assert missing.status_code == 404 and "'org/model-7b'" in missing.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"version": "v1", "path": "relative/dir"}, "body.path", "absolute"),
        ({"version": "v1", "path": "/no/such/dir"}, "body.path", "not a directory"),
        ({"version": "v 1", "path": "/x"}, "body.version", "pattern"),
        ({"version": "v1", "path": "/x", "pause_mode": "later"}, "body.pause_mode", "keep"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_no_backend_is_touched(
    make_client, redis: Redis, settings: Settings, doubles, body: dict, field: str, words: str
) -> None:
    double = doubles()
    register(redis, settings, double.url)
    response = make_client().post("/v1/models/tiny/weights", json=body)
    assert response.status_code == 422, response.text
    problem = response.json()["errors"][0]
    assert problem["field"] == field and words in problem["message"], problem
    assert not double.received.is_set()


def test_a_checkpoint_outside_the_roots_is_refused_before_any_backend_is_touched(
    make_client, redis: Redis, settings: Settings, doubles, checkpoint: Path, tmp_path: Path
) -> None:
    double = doubles()
    register(redis, settings, double.url)
    (tmp_path / "roots").mkdir()
    (tmp_path / "roots" / "link").symlink_to(checkpoint)  # under the root by name only
    api = make_client(checkpoint_roots=[str(tmp_path / "roots")])
    for path in (checkpoint, tmp_path / "roots" / "link"):
        response = api.post("/v1/models/tiny/weights", json={"version": "v1", "path": str(path)})
        assert response.status_code == 422 and "outside the checkpoint roots" in response.text, response.text
        assert response.json()["errors"][0]["field"] == "body.path"
    assert not double.received.is_set()


def test_behind_gateways_without_roots_a_path_update_is_refused_naming_the_setting(
    make_client, redis: Redis, settings: Settings, doubles, checkpoint: Path
) -> None:
    double = doubles()
    register(redis, settings, double.url)
    api = make_client(backend_token="data", backend_admin_token="admin")
    response = api.post("/v1/models/tiny/weights", json={"version": "v1", "path": str(checkpoint)})
    assert response.status_code == 422 and "ROLLOUTS_CHECKPOINT_ROOTS" in response.text, response.text
    assert not double.received.is_set()


def test_a_checkpoint_without_safetensors_is_refused(make_client, redis, settings, doubles, tmp_path: Path) -> None:
    register(redis, settings, doubles().url)
    (tmp_path / "empty").mkdir()
    response = make_client().post("/v1/models/tiny/weights", json={"version": "v1", "path": str(tmp_path / "empty")})
    assert response.status_code == 422 and "safetensors" in response.json()["detail"]


def test_a_backend_that_fails_the_update_leaves_the_pool_and_probes_do_not_bring_it_back(
    make_client, redis: Redis, settings: Settings, doubles, checkpoint: Path
) -> None:
    backend_id = register(redis, settings, doubles().url)
    api = make_client()
    result = api.post("/v1/models/tiny/weights", json={"version": "v1", "path": str(checkpoint)}).json()
    [outcome] = result["backends"]
    assert outcome["status"] == "failed" and outcome["removed_from_pool"] and "pause" in outcome["error"]
    assert result["seq"] == 0 and api.get("/v1/models/tiny/weights").json()["version"] is None  # nobody took v1
    view = api.get(f"/v1/backends/{backend_id}").json()
    assert not view["healthy"] and view["unhealthy_reason"].startswith("stale weights")
    pool = BackendPool(redis, Keys(settings.redis_prefix), settings)
    assert pool.maintain().recovered == []  # /health passes, but its weights are stale
    assert not pool.get(backend_id).healthy


def test_a_second_concurrent_update_of_the_model_gets_409(
    make_client, redis: Redis, settings: Settings, doubles, checkpoint: Path
) -> None:
    double = doubles(hang=True)
    register(redis, settings, double.url)
    api = make_client()
    first: dict = {}
    thread = threading.Thread(
        target=lambda: first.update(
            r=api.post("/v1/models/tiny/weights", json={"version": "v1", "path": str(checkpoint)})
        )
    )
    thread.start()
    assert double.received.wait(30), "the first update never reached the backend"
    second = api.post("/v1/models/tiny/weights", json={"version": "v2", "path": str(checkpoint)})
    assert second.status_code == 409 and "another weight update" in second.json()["detail"]
    double.release.set()
    thread.join(60)
    assert first["r"].status_code == 200
    # the lock is gone with the first update: the next one runs (and fails on the double, as it should)
    assert api.post("/v1/models/tiny/weights", json={"version": "v2", "path": str(checkpoint)}).status_code == 200


def test_a_server_registering_with_other_weights_than_the_models_current_ones_is_registered_unhealthy(
    make_client, redis: Redis, settings: Settings, doubles
) -> None:
    """A vLLM restarted on the base weights after updates must not be routed to until it has the current ones."""
    api = make_client()
    fresh = doubles(weight_version="default")
    before = api.post("/v1/backends", json={"url": fresh.url, "model": "tiny"}).json()
    assert before["healthy"], before  # the model was never updated: nothing to be behind
    WeightVersions(redis, Keys(settings.redis_prefix)).record("tiny", "v2", "/ckpt/v2")
    servers = {"behind": fresh, "current": doubles(weight_version="v2"), "silent": doubles()}
    views = {
        name: api.post("/v1/backends", json={"url": double.url, "model": "tiny"}).json()
        for name, double in servers.items()
    }
    assert not views["behind"]["healthy"], views
    assert views["behind"]["unhealthy_reason"] == (
        "stale weights: it serves version 'default', the model's current one is 'v2'"
    ), views
    assert views["current"]["healthy"] and views["silent"]["healthy"], views  # silent: no /weight_info to compare
    pool = BackendPool(redis, Keys(settings.redis_prefix), settings)
    assert pool.maintain().recovered == [], views  # its /health passes; only the current weights bring it back


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/ckpt/v2", "stale weights: update to 'v2' failed at pause"),  # tried after the answer, and failed
        ("upload:sha256:0123", "stale weights: the model's current weights 'v2' were sent as bytes"),  # nothing to load
    ],
)
def test_a_backend_registering_behind_is_brought_up_to_the_current_weights_or_stays_out_saying_why(
    make_client, redis: Redis, settings: Settings, doubles, path: str, reason: str
) -> None:
    WeightVersions(redis, Keys(settings.redis_prefix)).record("tiny", "v2", path)
    behind = doubles(weight_version="default")  # a restarted vLLM on the base weights; updates fail on it
    view = make_client().post("/v1/backends", json={"url": behind.url, "model": "tiny"}).json()
    assert not view["healthy"]
    backend = BackendPool(redis, Keys(settings.redis_prefix), settings).get(view["id"])
    assert backend is not None and backend.unhealthy_reason.startswith(reason), backend.unhealthy_reason
    assert behind.received.is_set() == (not path.startswith("upload:"))
