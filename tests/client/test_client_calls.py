"""The client calls the CLI makes (status, backends), its environment defaults and its 422 details,
against a scripted transport (no server)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rollouts_client import ApiError, AsyncRolloutClient, JobsProgress, RetryPolicy, RolloutClient

NO_WAIT = RetryPolicy(retries=2, first_delay_s=0.0, max_delay_s=0.0)
BACKEND = {"id": "node7-8000", "url": "http://node7:8000", "model": "m", "healthy": True, "draining": False}


class Recorder:
    """Answers from a table keyed by (method, path); records each request with its JSON body."""

    def __init__(self, answers: dict[tuple[str, str], list[httpx.Response]]) -> None:
        self.answers = answers
        self.seen: list[tuple[str, str, object, str | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, body, request.headers.get("authorization")))
        return self.answers[(request.method, request.url.path)].pop(0)


def test_backend_calls_send_what_the_api_takes_and_read_what_it_answers() -> None:
    api = Recorder(
        {
            ("POST", "/v1/backends"): [httpx.Response(201, json=BACKEND)],
            ("POST", "/v1/backends/node7-8000/heartbeat"): [httpx.Response(200, json=BACKEND)],
            ("POST", "/v1/backends/node7-8000/drain"): [httpx.Response(200, json={**BACKEND, "draining": True})],
            ("GET", "/v1/backends"): [
                httpx.Response(200, json={"backends": [BACKEND], "inflight": 0, "selectable": 1})
            ],
            ("DELETE", "/v1/backends/node7-8000"): [httpx.Response(204), httpx.Response(404, json={"detail": "no"})],
        }
    )
    with RolloutClient("http://api", "admin", transport=httpx.MockTransport(api)) as client:
        assert client.register_backend("http://node7:8000", "m", labels={"gpu": "h100"})["id"] == "node7-8000"
        assert client.backend_heartbeat("node7-8000")["healthy"]
        assert client.drain_backend("node7-8000")["draining"]
        assert client.list_backends() == [BACKEND]
        assert client.deregister_backend("node7-8000") is True
        assert client.deregister_backend("node7-8000") is False  # already gone
    registration = {"url": "http://node7:8000", "model": "m", "labels": {"gpu": "h100"}}  # the rest: API defaults
    assert api.seen[0] == ("POST", "/v1/backends", registration, "Bearer admin")
    assert api.seen[2][2] == {"draining": True}


def test_a_forgotten_backend_is_an_api_error_404() -> None:
    api = Recorder({("POST", "/v1/backends/b/heartbeat"): [httpx.Response(404, json={"detail": "no backend 'b'"})]})
    with RolloutClient("http://api", transport=httpx.MockTransport(api)) as client, pytest.raises(ApiError) as caught:
        client.backend_heartbeat("b")
    assert caught.value.status_code == 404 and caught.value.detail == "no backend 'b'"


def test_status_is_retried_on_503_and_health_is_one_try() -> None:
    stages = {"stages": {"init": {"queued": 0}}, "jobs": {}, "in_flight": 0}
    api = Recorder(
        {
            ("GET", "/v1/status"): [httpx.Response(503, json={"detail": "redis"}), httpx.Response(200, json=stages)],
            ("GET", "/healthz"): [httpx.Response(503, json={"detail": "redis"})],
        }
    )
    with RolloutClient("http://api", retry=NO_WAIT, transport=httpx.MockTransport(api)) as client:
        assert client.status() == stages
        assert client.health() is False
    assert [path for _, path, _, _ in api.seen] == ["/v1/status", "/v1/status", "/healthz"]


def test_health_is_false_while_nothing_listens() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with RolloutClient("http://api", transport=httpx.MockTransport(refuse)) as client:
        assert client.health() is False


def test_a_422_names_each_refused_job() -> None:
    problems = [{"field": "body[1].task.kind", "message": "unknown kind"}]
    api = Recorder({("POST", "/v1/jobs"): [httpx.Response(422, json={"detail": "...", "errors": problems})]})
    with RolloutClient("http://api", transport=httpx.MockTransport(api)) as client, pytest.raises(ApiError) as caught:
        client.submit_jobs([{"task": {"kind": "demo"}}, {"task": {"kind": "nope"}}])
    assert caught.value.status_code == 422 and caught.value.errors == problems


def test_url_and_token_default_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_API_URL", "http://from-env:8000")
    monkeypatch.setenv("ROLLOUTS_API_TOKEN", "env-token")
    with RolloutClient() as client:
        assert str(client.http.base_url) == "http://from-env:8000"
        assert client.http.headers["authorization"] == "Bearer env-token"
    with RolloutClient("http://given", "given-token") as client:  # what the code says wins
        assert client.http.headers["authorization"] == "Bearer given-token"

    async def base_url() -> str:
        async with AsyncRolloutClient() as client:
            return str(client.http.base_url)

    assert asyncio.run(base_url()) == "http://from-env:8000"


def test_no_url_anywhere_says_which_variable_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLOUTS_API_URL", raising=False)
    with pytest.raises(ValueError, match="ROLLOUTS_API_URL"):
        RolloutClient()


def test_a_post_with_an_idempotency_key_is_retried_after_a_lost_answer() -> None:
    calls: list[httpx.Request] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return httpx.Response(202, json={"job_ids": ["j1"], "created": [False]})

    policy = RetryPolicy(retries=2, first_delay_s=0.0, max_delay_s=0.0)
    with RolloutClient("http://api", retry=policy, msgpack=False, transport=httpx.MockTransport(flaky)) as client:
        assert client.submit_jobs({"task": {"kind": "demo"}}, idempotency_key="k") == ["j1"]
        assert [c.headers["idempotency-key"] for c in calls] == ["k", "k"]
        calls.clear()
        with pytest.raises(httpx.ReadTimeout):  # without a key a lost answer may hide a taken job: no retry
            client.submit_jobs({"task": {"kind": "demo"}})
        assert len(calls) == 1


def test_weight_calls_send_what_the_api_takes_sync_and_async() -> None:
    result = {"model": "org/m", "version": "v2", "seq": 2, "seconds": 0.1, "backends": []}
    current = {"model": "org/m", "version": "v2", "seq": 2, "path": "/ckpt", "applied_at": 1.0}

    def answers() -> dict[tuple[str, str], list[httpx.Response]]:
        return {
            ("POST", "/v1/models/org/m/weights"): [httpx.Response(200, json=result)],
            ("GET", "/v1/models/org/m/weights"): [httpx.Response(200, json=current)],
        }

    api = Recorder(answers())
    with RolloutClient("http://api", transport=httpx.MockTransport(api)) as client:
        assert client.update_weights("org/m", "v2", path="/ckpt", pause_mode="keep", lora="a") == result
        assert client.current_weights("org/m") == current
    assert api.seen[0][2] == {"version": "v2", "path": "/ckpt", "pause_mode": "keep", "lora": "a"}

    async_api = Recorder(answers())

    async def calls() -> None:
        async with AsyncRolloutClient("http://api", transport=httpx.MockTransport(async_api)) as client:
            assert await client.update_weights("org/m", "v2", path="/ckpt") == result
            assert await client.current_weights("org/m") == current

    asyncio.run(calls())
    assert async_api.seen[0][2] == {"version": "v2", "path": "/ckpt", "pause_mode": "wait"}


def test_an_upload_sends_the_bytes_as_the_body_and_the_rest_as_the_query_sync_and_async() -> None:
    result = {"model": "org/m", "version": "v3", "seq": 3, "seconds": 0.1, "backends": []}
    seen: list[httpx.Request] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=result)

    with RolloutClient("http://api", transport=httpx.MockTransport(api)) as client:
        assert client.upload_weights("org/m", "v3", b"\x08safetensors", pause_mode="keep") == result
        with pytest.raises(TypeError, match="bytes of a safetensors file"):
            client.upload_weights("org/m", "v3", "/a/path/is/not/bytes")  # type: ignore[arg-type]

    async def calls() -> None:
        async with AsyncRolloutClient("http://api", transport=httpx.MockTransport(api)) as client:
            assert await client.upload_weights("org/m", "v4", bytearray(b"\x08more")) == result

    asyncio.run(calls())
    assert [(r.method, r.url.path, dict(r.url.params), r.headers["content-type"], r.content) for r in seen] == [
        (
            "PUT",
            "/v1/models/org/m/weights",
            {"version": "v3", "pause_mode": "keep"},
            "application/octet-stream",
            b"\x08safetensors",
        ),
        (
            "PUT",
            "/v1/models/org/m/weights",
            {"version": "v4", "pause_mode": "wait"},
            "application/octet-stream",
            b"\x08more",
        ),
    ]


def summary(job_id: str, status: str) -> dict[str, object]:
    return {"id": job_id, "status": status, "kind": "demo", "created_at": 0.0, "updated_at": 0.0}


@pytest.mark.parametrize("make", [RolloutClient, AsyncRolloutClient])
def test_wait_jobs_long_polls_and_falls_back_to_polling_where_the_service_answers_at_once(
    make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service that pushes: one request per end. One that ignores `wait_s` (older, or its events
    down): the client sleeps `poll_s` between requests instead of spinning."""
    polls: list[tuple[str | None, float | None]] = []
    slept: list[float] = []
    statuses = iter(["running", "running", "done"])

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":
            polls.append((request.url.params.get("wait_s"), request.extensions["timeout"]["read"]))
            return httpx.Response(200, json={"jobs": [summary("j1", next(statuses))], "limit": 1, "offset": 0})
        return httpx.Response(200, json={**summary("j1", "done"), "timings": {}, "attempts": {}})

    monkeypatch.setattr("time.sleep", slept.append)

    async def no_wait(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("asyncio.sleep", no_wait)
    client = make("http://api", transport=httpx.MockTransport(answer))
    waited = client.wait_jobs(["j1"], timeout=100, poll_s=0.25)
    jobs = asyncio.run(waited) if asyncio.iscoroutine(waited) else waited
    assert [job.status for job in jobs] == ["done"]
    assert [float(wait) for wait, _ in polls] == [30.0, 30.0, 30.0]  # long polls, each within the timeout
    assert all(read > 30 for _, read in polls), "the request's read timeout outlasts its wait"
    assert slept == [0.25, 0.25], "answered at once with nothing ended: poll_s between, no spinning"


@pytest.mark.parametrize("make", [RolloutClient, AsyncRolloutClient])
def test_watch_jobs_gives_each_answer_what_ended_what_runs_and_what_the_service_did_not_list(make) -> None:
    """The one waiter's updates (what the CLI's progress shows): `update_s` bounds each long poll."""
    answers = iter([[("a", "running"), ("b", "rollout")], [("a", "done"), ("b", "eval")], [("b", "failed")]])
    waits: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        waits.append(request.url.params.get("wait_s"))
        jobs = [summary(job_id, status) for job_id, status in next(answers)]
        return httpx.Response(200, json={"jobs": jobs, "limit": len(jobs), "offset": 0})

    client = make("http://api", transport=httpx.MockTransport(answer))
    watch = client.watch_jobs(["a", "b", "gone"], timeout=100, poll_s=0.0, update_s=2.0)

    async def updates() -> list[JobsProgress]:
        return [update async for update in watch]

    seen = asyncio.run(updates()) if make is AsyncRolloutClient else list(watch)
    assert [([j.id for j in u.ended], [j.status for j in u.running], u.unlisted) for u in seen] == [
        ([], ["running", "rollout"], ["gone"]),
        (["a"], ["eval"], []),
        (["b"], [], []),
    ]
    assert [float(wait) for wait in waits] == [2.0, 2.0, 2.0]
