"""The bytes form of the weights route (PUT, a safetensors body) without vLLM: who may call it, the
body checks made before any backend is touched, its own size limit, and a failing backend (a test
double that errors) leaving the pool."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from redis import Redis
from safetensors.numpy import save

from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.keys import Keys
from tests.support.broken_weights_backend import BrokenWeightsBackend

ADMIN = {"Authorization": "Bearer admin-token"}
USER = {"Authorization": "Bearer user-token"}
OCTETS = {"Content-Type": "application/octet-stream"}
FITS = save({"w": np.zeros((2, 2), dtype=np.float32)})  # the served model (conftest.py) has one tensor w [2, 2]


@pytest.fixture()
def double_root(served_model: Path) -> str:
    """The doubles here report the served model as their root, as vLLM does: what an upload is checked against."""
    return str(served_model)


def register(redis: Redis, settings: Settings, double: BrokenWeightsBackend) -> str:
    """As the API registers a vLLM server: with its /v1/models `root`, the served model's directory."""
    pool = BackendPool(redis, Keys(settings.redis_prefix), settings)
    return pool.register(double.url, "tiny", tokenizer=double.root).id


def put(api, data: bytes, headers: dict[str, str] | None = None, **params: str):  # type: ignore[no-untyped-def]
    return api.put(
        "/v1/models/tiny/weights",
        params={"version": "v1", **params},
        content=data,
        headers={**OCTETS, **(headers or {})},
    )


def test_only_an_admin_may_upload_weights(make_client) -> None:
    api = make_client(api_tokens=["user-token"], admin_tokens=["admin-token"])
    assert put(api, FITS).status_code == 401
    refused = put(api, FITS, USER)
    assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    assert put(api, FITS, ADMIN).status_code == 404  # an admin gets through: no backend of tiny


@pytest.mark.parametrize(
    ("data", "params", "field", "words"),
    [
        (b"not a safetensors file", {}, "body", "not a safetensors file"),
        (FITS[:-3], {}, "body", "not a safetensors file"),  # cut short: the header names more bytes than came
        (save({"w": np.zeros((3, 2), dtype=np.float32)}), {}, "body", "w is [3, 2], the model's is [2, 2]"),
        (save({"w": np.zeros((2, 2), dtype=np.float32), "extra": np.zeros(1)}), {}, "body", "unknown ['extra']"),
        (save({"v": np.zeros((2, 2), dtype=np.float32)}), {}, "body", "missing ['w']"),
        (FITS, {"version": "v 1"}, "query.version", "pattern"),
        (FITS, {"pause_mode": "later"}, "query.pause_mode", "keep"),
    ],
)
def test_a_body_that_does_not_fit_is_refused_naming_the_field_and_no_backend_is_touched(
    make_client, redis: Redis, settings: Settings, doubles, data: bytes, params: dict, field: str, words: str
) -> None:
    double = doubles()
    register(redis, settings, double)
    response = put(make_client(), data, **params)
    assert response.status_code == 422, response.text
    problem = response.json()["errors"][0]
    assert problem["field"] == field and words in problem["message"], problem
    assert not double.received.is_set()


def test_a_body_that_is_not_octets_gets_415(make_client, redis: Redis, settings: Settings, doubles) -> None:
    double = doubles()
    register(redis, settings, double)
    response = put(make_client(), FITS, {"Content-Type": "application/json"})
    assert response.status_code == 415 and "application/octet-stream" in response.json()["detail"]
    assert not double.received.is_set()


def test_the_upload_has_its_own_size_limit_and_other_routes_keep_theirs(make_client) -> None:
    api = make_client(max_body_bytes=2000, max_weight_bytes=len(FITS) + 4000)
    assert put(api, FITS + b"\0" * 3000).status_code != 413  # over max_body_bytes, under max_weight_bytes
    too_large = put(api, FITS + b"\0" * 5000)
    assert too_large.status_code == 413 and str(len(FITS) + 4000) in too_large.json()["detail"]
    post = api.post("/v1/models/tiny/weights", json={"version": "v1", "path": "/" + "x" * 3000})
    assert post.status_code == 413  # the JSON form keeps max_body_bytes


def test_a_backend_that_fails_the_upload_leaves_the_pool(
    make_client, redis: Redis, settings: Settings, doubles
) -> None:
    backend_id = register(redis, settings, doubles())
    api = make_client()
    result = put(api, FITS).json()
    [outcome] = result["backends"]
    assert outcome["status"] == "failed" and outcome["removed_from_pool"] and "pause" in outcome["error"]
    assert result["seq"] == 0 and api.get("/v1/models/tiny/weights").json()["version"] is None
    assert not api.get(f"/v1/backends/{backend_id}").json()["healthy"]
