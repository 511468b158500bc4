"""The jobs API in-process against a real redis-server: validation, idempotency, auth, formats."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq import Queue

from shared.keys import Keys

DEMO = {"task": {"kind": "demo", "text": "abc"}}


@pytest.fixture()
def client(make_client) -> TestClient:
    return make_client()


def stored_nothing(redis: Redis) -> bool:
    return redis.zcard(Keys().jobs_all) == 0 and Queue("init", connection=redis).count == 0


def problem_fields(response) -> list[str]:
    return [e["field"] for e in response.json()["errors"]]


def test_submit_one_job_answers_202_with_its_id_and_queues_it_on_init(client, redis):
    response = client.post("/v1/jobs", json=DEMO)
    assert response.status_code == 202
    (job_id,) = response.json()["job_ids"]
    assert response.json()["created"] == [True]
    assert len(job_id) == 32 and int(job_id, 16) >= 0
    assert Queue("init", connection=redis).job_ids == [f"{job_id}-init"]
    record = client.get(f"/v1/jobs/{job_id}").json()
    assert record["status"] == "queued" and record["kind"] == "demo"
    assert record["request"]["task"] == DEMO["task"]
    assert record["request"]["limits"]["max_turns"] == 16  # defaults are filled in and stored
    assert record["request"]["chat_template_kwargs"] == {}
    assert record["result"] is None


def test_job_ids_are_random_not_sequential(client):
    ids = client.post("/v1/jobs", json=[DEMO] * 50).json()["job_ids"]
    assert len(set(ids)) == 50
    assert ids != sorted(ids) and ids != sorted(ids, reverse=True)  # not a counter
    assert len({job_id[:4] for job_id in ids}) > 40  # not time-based either (those share a prefix)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"task": {"kind": "nope"}}, 422, "body.task.kind"),
        ({"sampling": {}}, 422, "body.task"),
        ({"task": {"text": "x"}}, 422, "body.task"),
        ({"task": {"kind": "demo"}}, 422, "body.task.text"),  # the demo kind's own check: task.text is required
        ({**DEMO, "limits": {"max_turns": -1}}, 422, "body.limits.max_turns"),
        ({**DEMO, "limits": {"rollout_timeout_s": -5}}, 422, "body.limits.rollout_timeout_s"),
        ({**DEMO, "limits": {"max_prompt_tokens": 0}}, 422, "body.limits.max_prompt_tokens"),
        ({**DEMO, "limits": {"max_prompt_tokens": "long"}}, 422, "body.limits.max_prompt_tokens"),
        ({**DEMO, "sampling": {"temperature": "hot"}}, 422, "body.sampling.temperature"),
        ({**DEMO, "sample_index": -1}, 422, "body.sample_index"),
        ({**DEMO, "unexpected": 1}, 422, "body.unexpected"),
        ({**DEMO, "group_id": "b.batch.3"}, 422, "body.group_id"),  # reserved for batches' groups
        ({**DEMO, "chat_template_kwargs": {"tools": []}}, 422, "body.chat_template_kwargs"),  # the service's own
        ({**DEMO, "chat_template_kwargs": {"a-b": True}}, 422, "body.chat_template_kwargs"),
        ({**DEMO, "chat_template_kwargs": {"x": {"nested": 1}}}, 422, "body.chat_template_kwargs"),
        ([DEMO, {"task": {"kind": "nope"}}], 422, "body[1].task.kind"),
        ([], 422, "body"),
        ("just a string", 422, "body"),
    ],
)
def test_bad_jobs_are_rejected_with_the_field_named_and_nothing_stored(client, redis, body, status, field):
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == status, response.text
    assert field in problem_fields(response), response.json()
    assert field in response.json()["detail"]
    assert stored_nothing(redis)


# One case per source of a refusal: the registry, the kind's own validate, pydantic (a constraint, and a
# validator of ours, whose message pydantic would prefix with "Value error, ").
REFUSALS = {
    "unknown kind": ({"kind": "nope"}, {}, "task.kind", "unknown task kind 'nope'; known kinds: "),
    "bad field of a kind": ({"kind": "demo", "text": "x", "work_s": -1}, {}, "task.work_s", "a number of seconds"),
    "bad schema field": (
        {"kind": "demo", "text": "x"},
        {"limits": {"max_turns": 0}},
        "limits.max_turns",
        "Input should be greater than 0",
    ),
    "no kind": ({"text": "x"}, {}, "task", "task.kind (or task.format of a published row) is required"),
}


@pytest.mark.parametrize("case", REFUSALS)
@pytest.mark.parametrize("route", ["one job", "a list of jobs", "a batch"])
def test_every_refusal_has_one_shape_wherever_the_job_comes_from(client, redis, case, route):
    task, rest, field, message = REFUSALS[case]
    bad = {"task": task, **rest}
    if route == "one job":
        response, where = client.post("/v1/jobs", json=bad), f"body.{field}"
    elif route == "a list of jobs":
        response, where = client.post("/v1/jobs", json=[DEMO, bad]), f"body[1].{field}"
    else:
        body = {"prompts": [DEMO["task"], bad], "n_samples": 1}
        response, where = client.post("/v1/batches", json=body), f"body.prompts[1].{field}"
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["field"] == where and error["message"].startswith(message), error
    assert response.json() == {"detail": f"{where}: {error['message']}", "errors": [error]}
    assert stored_nothing(redis)


def test_a_list_with_many_bad_jobs_names_every_problem_by_index(client, redis):
    jobs = [DEMO, {"task": {"kind": "nope"}}, DEMO, {**DEMO, "limits": {"max_turns": 0}, "sample_index": -1}]
    response = client.post("/v1/jobs", json=jobs)
    assert response.status_code == 422
    assert problem_fields(response) == ["body[1].task.kind", "body[3].limits.max_turns", "body[3].sample_index"]
    assert stored_nothing(redis)


def test_bad_list_parameters_are_422s_of_the_same_shape(client):
    response = client.get("/v1/jobs", params={"status": "bogus"})
    assert response.status_code == 422 and problem_fields(response) == ["query.status"]
    assert "unknown status 'bogus'" in response.json()["detail"]
    assert problem_fields(client.get("/v1/jobs", params={"limit": 0})) == ["query.limit"]


def test_malformed_json_is_a_400(client, redis):
    response = client.post("/v1/jobs", content=b'{"task": {"kind": ', headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "malformed JSON" in response.json()["detail"]
    assert stored_nothing(redis)


def test_an_oversized_body_is_a_413_and_nothing_is_stored(make_client, redis):
    client = make_client(max_body_bytes=2000)
    big = {"task": {"kind": "demo", "text": "x" * 5000}}
    response = client.post("/v1/jobs", json=big)
    assert response.status_code == 413
    assert "2000 bytes" in response.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted as the body streams
        yield b'{"task": {"kind": "demo", "text": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}}'

    response = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert stored_nothing(redis)


def test_too_many_jobs_in_one_request_is_a_413(make_client, redis):
    client = make_client(max_jobs_per_request=3)
    response = client.post("/v1/jobs", json=[DEMO] * 4)
    assert response.status_code == 413 and "limit is 3" in response.json()["detail"]
    assert stored_nothing(redis)


def test_unknown_job_ids_are_404(client):
    assert client.get("/v1/jobs/0123456789abcdef0123456789abcdef").status_code == 404
    response = client.delete("/v1/jobs/nope")
    assert response.status_code == 404 and "nope" in response.json()["detail"]


def test_the_same_idempotency_key_returns_the_same_job(client, redis):
    job = {**DEMO, "idempotency_key": "batch-7/prompt-3/sample-0"}
    first = client.post("/v1/jobs", json=job).json()
    again = client.post("/v1/jobs", json=job).json()
    assert again["job_ids"] == first["job_ids"]
    assert first["created"] == [True] and again["created"] == [False]
    twice_in_one = client.post("/v1/jobs", json=[{**DEMO, "idempotency_key": "k2"}] * 2).json()
    assert twice_in_one["job_ids"][0] == twice_in_one["job_ids"][1]
    assert twice_in_one["created"] == [True, False]
    assert redis.zcard(Keys().jobs_all) == 2
    assert Queue("init", connection=redis).count == 2


def test_an_idempotency_key_left_behind_by_a_crashed_submit_creates_the_job(client, redis):
    redis.set(Keys().idempotency("orphan"), "00000000000000000000000000000001")
    response = client.post("/v1/jobs", json={**DEMO, "idempotency_key": "orphan"}).json()
    assert response == {"job_ids": ["00000000000000000000000000000001"], "created": [True]}
    assert client.get("/v1/jobs/00000000000000000000000000000001").json()["status"] == "queued"


def test_list_filters_by_status_and_group(client):
    ids = client.post(
        "/v1/jobs", json=[{**DEMO, "group_id": "g1", "sample_index": i} for i in (2, 0, 1)] + [DEMO]
    ).json()["job_ids"]
    client.delete(f"/v1/jobs/{ids[3]}")
    group = client.get("/v1/jobs", params={"group_id": "g1"}).json()["jobs"]
    assert [j["sample_index"] for j in group] == [0, 1, 2]
    assert [j["id"] for j in client.get("/v1/jobs", params={"status": "cancelled"}).json()["jobs"]] == [ids[3]]
    assert len(client.get("/v1/jobs", params={"status": "queued"}).json()["jobs"]) == 3
    assert len(client.get("/v1/jobs", params={"limit": 2}).json()["jobs"]) == 2
    assert client.get("/v1/jobs", params={"status": "bogus"}).status_code == 422
    assert client.get("/v1/jobs", params={"limit": 0}).status_code == 422


def test_cancel_a_queued_job_and_cancel_is_final(client):
    job_id = client.post("/v1/jobs", json=DEMO).json()["job_ids"][0]
    assert client.delete(f"/v1/jobs/{job_id}").json() == {"id": job_id, "status": "cancelled", "previous": "queued"}
    again = client.delete(f"/v1/jobs/{job_id}")
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]
    assert client.get(f"/v1/jobs/{job_id}").json()["error"]["type"] == "cancelled"


def test_msgpack_is_served_on_request(client):
    job_id = client.post("/v1/jobs", json=DEMO).json()["job_ids"][0]
    response = client.get(f"/v1/jobs/{job_id}", headers={"accept": "application/msgpack"})
    assert response.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(response.content)["id"] == job_id


def test_bearer_auth_guards_every_route_but_health(make_client):
    client = make_client(api_tokens=["s3cret"])
    assert client.get("/healthz").status_code == 200
    for method, path in [("get", "/v1/jobs"), ("post", "/v1/jobs"), ("get", "/v1/status"), ("delete", "/v1/jobs/x")]:
        assert client.request(method, path).status_code == 401, path
    wrong = client.get("/v1/status", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert client.get("/v1/status", headers={"authorization": "Bearer s3cret"}).status_code == 200


def test_status_reports_every_stage(client):
    client.post("/v1/jobs", json=[DEMO] * 3)
    status = client.get("/v1/status").json()
    assert set(status["stages"]) == {"init", "rollout", "eval"}
    assert status["stages"]["init"]["queued"] == 3
    assert status["jobs"]["queued"] == 3 and status["in_flight"] == 3


def test_openapi_describes_the_job_request(client):
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"$ref": "#/components/schemas/JobRequest"} in body["anyOf"]
    assert "JobRequest" in spec["components"]["schemas"] and "Limits" in spec["components"]["schemas"]
    assert client.get("/docs").status_code == 200


def test_openapi_describes_the_422_body_the_api_really_sends(client):
    spec = client.get("/openapi.json").json()
    refusal = {"$ref": "#/components/schemas/Refusal"}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            if "422" in operation["responses"]:
                assert operation["responses"]["422"]["content"]["application/json"]["schema"] == refusal, (method, path)
    schemas = spec["components"]["schemas"]
    assert set(schemas["Refusal"]["properties"]) == {"detail", "errors"}
    assert set(schemas["Problem"]["properties"]) == {"field", "message"}
    assert "HTTPValidationError" not in schemas  # FastAPI's default shape, which the API never sends
    for path in ("/v1/jobs", "/v1/batches"):
        assert spec["paths"][path]["post"]["responses"]["400"]["content"]["application/json"]["schema"] == refusal


def test_redis_down_is_a_503_not_a_500(make_client, redis_server):
    client = make_client(redis_url="redis://127.0.0.1:1/0")
    assert client.get("/healthz").status_code == 503
    response = client.get("/v1/jobs/abc")
    assert response.status_code == 503 and "Redis" in response.json()["detail"]
