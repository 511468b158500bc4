"""Who may do what: reader tokens submit and read, admin tokens also cancel and manage backends."""

from __future__ import annotations

import itertools

import pytest

DEMO = {"task": {"kind": "demo", "text": "abc"}}
READER = {"authorization": "Bearer reader-token"}
ADMIN = {"authorization": "Bearer admin-token"}


@pytest.fixture()
def scoped(make_client):
    return make_client(api_tokens=["reader-token"], admin_tokens=["admin-token"])


def test_a_reader_token_submits_and_reads_but_cannot_cancel(scoped):
    job_id = scoped.post("/v1/jobs", json=DEMO, headers=READER).json()["job_ids"][0]
    assert scoped.get(f"/v1/jobs/{job_id}", headers=READER).status_code == 200

    refused = scoped.delete(f"/v1/jobs/{job_id}", headers=READER)

    assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    assert scoped.get(f"/v1/jobs/{job_id}", headers=READER).json()["status"] == "queued"


def test_an_admin_token_cancels_and_also_has_every_reader_right(scoped):
    job_id = scoped.post("/v1/jobs", json=DEMO, headers=ADMIN).json()["job_ids"][0]
    response = scoped.delete(f"/v1/jobs/{job_id}", headers=ADMIN)
    assert response.status_code == 200 and response.json()["status"] == "cancelled"


def test_cancel_without_a_valid_token_is_401(scoped):
    job_id = scoped.post("/v1/jobs", json=DEMO, headers=READER).json()["job_ids"][0]
    assert scoped.delete(f"/v1/jobs/{job_id}").status_code == 401
    assert scoped.delete(f"/v1/jobs/{job_id}", headers={"authorization": "Bearer guess"}).status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/v1/backends", {"url": "http://127.0.0.1:9/", "model": "m"}),
        ("post", "/v1/backends/b1/heartbeat", None),
        ("post", "/v1/backends/b1/drain", {"draining": True}),
        ("delete", "/v1/backends/b1", None),
        ("post", "/v1/models/m/weights", {"version": "v1", "path": "/tmp"}),  # every backend loads what it names
    ],
)
def test_backend_management_needs_the_admin_scope(scoped, method, path, body):
    response = scoped.request(method, path, json=body, headers=READER)
    assert response.status_code == 403, response.text


def test_with_admin_tokens_unset_any_api_token_may_cancel(make_client):
    client = make_client(api_tokens=["only-token"])
    headers = {"authorization": "Bearer only-token"}
    job_id = client.post("/v1/jobs", json=DEMO, headers=headers).json()["job_ids"][0]
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 401
    assert client.delete(f"/v1/jobs/{job_id}", headers=headers).status_code == 200


def test_job_ids_are_random_not_sequential(make_client):
    client = make_client()
    ids = client.post("/v1/jobs", json=[DEMO] * 50).json()["job_ids"]
    numbers = [int(job_id, 16) for job_id in ids]
    assert len(set(ids)) == 50 and all(len(job_id) == 32 for job_id in ids)
    steps = {b - a for a, b in itertools.pairwise(numbers)}
    assert len(steps) == 49, "ids advance by a fixed step: guessable"
    # 128 random bits: the high halves of 50 ids are spread over the whole range, not clustered.
    assert max(numbers) - min(numbers) > 2**120


def test_a_batch_is_cancelled_only_with_the_admin_scope(scoped):
    batch = scoped.post("/v1/batches", json={"prompts": [DEMO["task"]], "n_samples": 2}, headers=READER)
    assert batch.status_code == 202, batch.text
    batch_id = batch.json()["id"]
    refused = scoped.delete(f"/v1/batches/{batch_id}", headers=READER)
    assert refused.status_code == 403
    assert scoped.get(f"/v1/batches/{batch_id}", headers=READER).json()["status"] == "running"
    assert scoped.delete(f"/v1/batches/{batch_id}", headers=ADMIN).status_code == 200


def test_an_unknown_token_on_an_admin_route_is_401_with_a_challenge_not_403(scoped):
    unknown = scoped.post("/v1/backends/some-id/drain", headers={"authorization": "Bearer guess"})
    reader = scoped.post("/v1/backends/some-id/drain", headers=READER)

    assert unknown.status_code == 401 and unknown.headers["www-authenticate"] == "Bearer"
    assert reader.status_code == 403 and "admin" in reader.json()["detail"]
