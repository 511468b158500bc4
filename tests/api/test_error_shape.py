"""Every error the API sends has one shape, `{"detail", "errors": [{"field", "message"}]}`, as OpenAPI says."""

from __future__ import annotations

import pytest

from cli.embedded_redis import free_port

READER = {"authorization": "Bearer reader"}


@pytest.fixture()
def client(make_client):
    return make_client(api_tokens=["reader"], admin_tokens=["admin"], max_body_bytes=2000)


def assert_one_shape(response, status: int, field: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"detail", "errors"} and isinstance(body["detail"], str) and body["detail"]
    assert [problem["field"] for problem in body["errors"]] == [field]
    assert all(set(problem) == {"field", "message"} for problem in body["errors"])


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "field"),
    [
        ("get", "/v1/jobs/nope", {"headers": READER}, 404, "path"),
        ("get", "/v1/batches/nope", {"headers": READER}, 404, "path"),
        ("get", "/v1/jobs", {}, 401, "header.authorization"),
        ("delete", "/v1/jobs/nope", {"headers": READER}, 403, "header.authorization"),
        ("put", "/v1/jobs", {"headers": READER}, 405, "method"),
        ("post", "/v1/jobs", {"headers": READER, "content": b"[" + b"1," * 2000 + b"1]"}, 413, "body"),
        ("get", "/v1/jobs?status=bogus", {"headers": READER}, 422, "query.status"),
        ("post", "/v1/jobs", {"headers": READER, "content": b"{"}, 400, "body"),
    ],
)
def test_every_error_has_the_refusal_shape(client, method, path, kwargs, status, field):
    assert_one_shape(getattr(client, method)(path, **kwargs), status, field)


def test_a_cancel_of_a_finished_job_is_409_in_the_same_shape(make_client, redis):
    client = make_client()
    job_id = client.post("/v1/jobs", json={"task": {"kind": "demo", "text": "a"}}).json()["job_ids"][0]
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 200
    assert_one_shape(client.delete(f"/v1/jobs/{job_id}"), 409, "path")


def test_redis_away_is_503_with_retry_after_in_the_same_shape(make_client):
    away = make_client(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    response = away.get("/v1/jobs/some-id")
    assert_one_shape(response, 503, "")
    assert response.headers["retry-after"] == "1"


def test_openapi_describes_every_declared_error_as_the_refusal(client):
    schema = client.get("/openapi.json").json()
    declared = [
        (path, method, code, response)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        for code, response in operation.get("responses", {}).items()
        if code[0] in "45"
    ]
    assert declared
    for path, method, code, response in declared:
        assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Refusal"}, (
            path,
            method,
            code,
        )
