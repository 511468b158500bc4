"""Inputs the service could store but not give back: deep nesting, inexact integers, huge offsets, reused keys.

Each was a 500 (or a silent change of the data) before it was refused here with a 4xx naming the field.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.json_body import INT_MAX, INT_MIN

DEMO = {"task": {"kind": "demo", "text": "abc"}}


@pytest.fixture()
def client(make_client) -> TestClient:
    return make_client()


def nested(depth: int) -> str:
    """`depth` objects inside one another, as raw JSON (Python's own encoder stops near 1,000)."""
    return '{"a":' * depth + "1" + "}" * depth


def with_metadata(raw_metadata: str) -> str:
    return '{"task": {"kind": "demo", "text": "abc"}, "metadata": ' + raw_metadata + "}"


def fields(response) -> list[str]:
    return [problem["field"] for problem in response.json()["errors"]]


@pytest.mark.parametrize("depth", [64, 254, 256, 1020, 5000])
def test_a_body_nested_past_the_limit_is_a_4xx_naming_where(client, depth):
    response = client.post("/v1/jobs", content=with_metadata(nested(depth)))

    assert response.status_code == 422, response.text
    assert "levels deep" in response.json()["detail"]
    assert fields(response)[0].startswith("body")


def test_a_body_inside_the_limit_is_stored_and_read_back_whole(client):
    response = client.post("/v1/jobs", content=with_metadata(nested(40)))
    assert response.status_code == 202, response.text

    view = client.get(f"/v1/jobs/{response.json()['job_ids'][0]}")

    assert view.status_code == 200
    metadata = view.json()["request"]["metadata"]
    for _ in range(40):
        metadata = metadata["a"]
    assert metadata == 1


def test_the_depth_limit_is_a_setting(make_client):
    strict = make_client(max_json_depth=8)
    assert strict.post("/v1/jobs", content=with_metadata(nested(10))).status_code == 422
    assert strict.post("/v1/jobs", content=with_metadata(nested(3))).status_code == 202


@pytest.mark.parametrize("number", [INT_MAX + 1, INT_MIN - 1, 10**30, -(10**40)])
def test_an_integer_outside_the_exact_range_is_refused_not_rounded(client, number):
    response = client.post("/v1/jobs", content=with_metadata('{"seed_bank": [1, ' + str(number) + "]}"))

    assert response.status_code == 422, response.text
    assert fields(response) == ["body.metadata.seed_bank[1]"]


@pytest.mark.parametrize("number", [INT_MAX, INT_MIN, 2**63, 12345678901234567890])
def test_integers_at_the_edges_of_the_range_come_back_exact(client, number):
    response = client.post("/v1/jobs", content=with_metadata('{"n": ' + str(number) + ', "s": "' + "9" * 30 + '"}'))
    assert response.status_code == 202, response.text

    metadata = client.get(f"/v1/jobs/{response.json()['job_ids'][0]}").json()["request"]["metadata"]

    assert metadata == {"n": number, "s": "9" * 30}


def test_malformed_json_is_a_400_in_the_refusal_shape(client):
    response = client.post("/v1/jobs", content=b'{"task": ')
    assert response.status_code == 400
    assert fields(response) == ["body"] and "malformed JSON" in response.json()["detail"]


@pytest.mark.parametrize("query", ["offset=" + str(10**30), "offset=1000000001", "limit=" + str(10**30), "offset=-1"])
def test_list_bounds_are_422_naming_the_parameter(client, query):
    response = client.get(f"/v1/jobs?{query}")
    assert response.status_code == 422, response.text
    assert fields(response) == ["query." + query.split("=")[0]]


def test_an_offset_past_the_jobs_is_an_empty_page(client):
    client.post("/v1/jobs", json=DEMO)
    response = client.get("/v1/jobs?offset=1000000000")
    assert response.status_code == 200 and response.json()["jobs"] == []


def test_an_idempotency_key_reused_with_the_same_body_returns_the_same_job(client):
    job = {**DEMO, "idempotency_key": "k-1"}
    first = client.post("/v1/jobs", json=job).json()
    again = client.post("/v1/jobs", json=job).json()
    assert again == {"job_ids": first["job_ids"], "created": [False]}


def test_an_idempotency_key_reused_with_another_body_is_a_409_naming_the_key(client):
    first = client.post("/v1/jobs", json={**DEMO, "idempotency_key": "k-2"}).json()["job_ids"][0]

    other = {"task": {"kind": "demo", "text": "something else"}, "idempotency_key": "k-2"}
    single = client.post("/v1/jobs", json=other)
    listed = client.post("/v1/jobs", json=[DEMO, other])

    assert single.status_code == 409 and fields(single) == ["body.idempotency_key"]
    assert first in single.json()["detail"] and "k-2" in single.json()["detail"]
    assert listed.status_code == 409 and fields(listed) == ["body[1].idempotency_key"]
    assert client.get("/v1/jobs").json()["jobs"][0]["id"] == first  # nothing of the refused list was stored


def test_one_key_twice_in_one_request_with_different_bodies_is_a_409(client):
    other = {"task": {"kind": "demo", "text": "xyz"}, "idempotency_key": "k-3"}
    response = client.post("/v1/jobs", json=[{**DEMO, "idempotency_key": "k-3"}, other])
    assert response.status_code == 409 and fields(response) == ["body[1].idempotency_key"]


def test_batches_refuse_deep_bodies_too(client):
    body = '{"prompts": [{"task": {"kind": "demo", "text": "a"}, "metadata": ' + nested(100) + '}], "n": 2}'
    response = client.post("/v1/batches", content=body)
    assert response.status_code == 422 and "deep" in response.text


def test_the_idempotency_key_header_makes_a_retry_safe(client):
    first = client.post("/v1/jobs", json=DEMO, headers={"Idempotency-Key": "step-7"}).json()
    retry = client.post("/v1/jobs", json=DEMO, headers={"Idempotency-Key": "step-7"}).json()
    other = client.post("/v1/jobs", json={"task": {"kind": "demo", "text": "b"}}, headers={"Idempotency-Key": "step-7"})

    assert retry == {"job_ids": first["job_ids"], "created": [False]}
    assert other.status_code == 409 and fields(other) == ["body.idempotency_key"]


def test_the_header_keys_each_job_of_a_list_by_its_index(client):
    jobs = [DEMO, {"task": {"kind": "demo", "text": "b"}}, {**DEMO, "idempotency_key": "own"}]
    first = client.post("/v1/jobs", json=jobs, headers={"Idempotency-Key": "batch-3"}).json()
    retry = client.post("/v1/jobs", json=jobs, headers={"Idempotency-Key": "batch-3"}).json()

    assert retry == {"job_ids": first["job_ids"], "created": [False, False, False]}
    assert len(set(first["job_ids"])) == 3
    stored = client.get(f"/v1/jobs/{first['job_ids'][1]}").json()["request"]
    assert stored["idempotency_key"] == "batch-3/1"
    assert client.get(f"/v1/jobs/{first['job_ids'][2]}").json()["request"]["idempotency_key"] == "own"


def test_a_deep_body_with_a_long_number_is_still_a_422_not_a_500(client):
    response = client.post(
        "/v1/jobs", content=with_metadata('{"n": 12345678901234567890123, "d": ' + nested(1010) + "}")
    )
    assert response.status_code == 422 and "levels deep" in response.json()["detail"]
