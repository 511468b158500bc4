"""complete_routed against scripted HTTP backends (httpx MockTransport) and a real Redis pool:
what is sent, and how timeouts, garbage and misnamed models fail over."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from redis import Redis

import shared.backend_pool as backend_pool
from shared.backend_pool import BackendPool, NoBackendAvailable
from shared.config import Settings
from shared.keys import Keys
from workers.rollout import llm_routing
from workers.rollout.llm_client import BackendUnavailable, BadBackendResponse, LLMClient, Sampling
from workers.rollout.llm_routing import complete_routed

from test_vllm_conformance import VLLM_REQUEST_FIELDS

Handler = Callable[[httpx.Request], httpx.Response]


def completion(token_ids: list[int], model: str = "policy-v1") -> dict:
    return {
        "id": "cmpl-1", "object": "text_completion", "created": 0, "model": model,
        "choices": [{
            "index": 0, "text": "", "finish_reason": "length", "stop_reason": None, "token_ids": token_ids,
            "logprobs": {"tokens": [f"token_id:{t}" for t in token_ids], "token_logprobs": [-0.5] * len(token_ids),
                         "text_offset": [0] * len(token_ids), "top_logprobs": None},
        }],
        "usage": {"prompt_tokens": 2, "completion_tokens": len(token_ids), "total_tokens": 2 + len(token_ids)},
    }


@pytest.fixture()
def pool(redis: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> BackendPool:
    # An overloaded vLLM still answers /health with 200: every probe passes.
    monkeypatch.setattr(backend_pool, "probe_health", lambda url, timeout_s: None)
    return BackendPool(redis, Keys(settings.redis_prefix), settings)


def scripted_client(handler: Handler) -> LLMClient:
    client = LLMClient(request_timeout_s=5, connect_timeout_s=1, max_retries=1, backoff_s=0.0)
    client._http.close()
    client._http = httpx.Client(transport=httpx.MockTransport(handler))
    return client


class Backends:
    """Two scripted backends; ``bad`` says how the first one to be called misbehaves."""

    def __init__(self, bad: Callable[[httpx.Request], httpx.Response]) -> None:
        self.bad_host: str | None = None
        self.requests: list[tuple[str, dict]] = []
        self.bad = bad

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.requests.append((host, json.loads(request.content)))
        if self.bad_host is None:
            self.bad_host = host
        if host == self.bad_host:
            return self.bad(request)
        return httpx.Response(200, json=completion([7, 8]))

    def sent_to(self, host: str | None) -> int:
        return sum(1 for h, _ in self.requests if h == host)


def timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("read timed out", request=request)


def test_request_names_the_pinned_model_and_only_vllm_fields(pool: BackendPool) -> None:
    pool.register("http://a:8000", "policy-v1")
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=completion([5]))

    with scripted_client(handler) as client:
        sampling = Sampling(max_tokens=4, seed=1, stop=("x",), stop_token_ids=(5,))
        turn = complete_routed(pool, client, "job-1", [1, 2, 3], sampling)
    [body] = bodies
    assert body["model"] == "policy-v1", "vLLM before 0.8 requires model; it also picks the served policy"
    assert set(body) <= VLLM_REQUEST_FIELDS
    assert body["prompt"] == [1, 2, 3] and body["logprobs"] == 0
    assert body["return_tokens_as_token_ids"] is True and body["return_token_ids"] is True
    assert turn.model == "policy-v1" and turn.token_ids == [5]


def test_a_read_timeout_fails_over_and_is_never_resent_to_the_same_backend(pool: BackendPool) -> None:
    for host in ("a", "b"):
        pool.register(f"http://{host}:8000", "policy-v1")
    backends = Backends(timeout)
    with scripted_client(backends) as client:
        turn = complete_routed(pool, client, "job-1", [1, 2], Sampling(max_tokens=2))
    assert turn.token_ids == [7, 8]
    assert backends.sent_to(backends.bad_host) == 1 and len(backends.requests) == 2
    assert pool.acquire("job-1").url != f"http://{backends.bad_host}:8000", "the pin moved"
    assert sum(b.inflight for b in pool.backends()) == 1


def test_a_read_timeout_with_no_other_backend_is_raised_after_one_request(pool: BackendPool) -> None:
    pool.register("http://a:8000", "policy-v1")
    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(1)
        raise httpx.ReadTimeout("read timed out", request=request)

    with scripted_client(handler) as client, pytest.raises(BackendUnavailable) as err:
        complete_routed(pool, client, "job-1", [1, 2], Sampling(max_tokens=2))
    assert err.value.timed_out and len(sent) == 1


def test_garbage_from_a_backend_fails_over(pool: BackendPool) -> None:
    for host in ("a", "b"):
        pool.register(f"http://{host}:8000", "policy-v1")
    backends = Backends(lambda request: httpx.Response(200, text="<html>proxy error</html>"))
    with scripted_client(backends) as client:
        assert complete_routed(pool, client, "job-1", [1, 2], Sampling(max_tokens=2)).token_ids == [7, 8]
    assert backends.sent_to(backends.bad_host) == 1
    assert all(b.healthy for b in pool.backends()), "garbage fails the call over, it does not mark the backend"


def test_garbage_everywhere_raises_bad_backend_response(pool: BackendPool) -> None:
    pool.register("http://a:8000", "policy-v1")
    with scripted_client(lambda request: httpx.Response(200, text="not json")) as client:
        with pytest.raises(BadBackendResponse, match="not JSON"):
            complete_routed(pool, client, "job-1", [1, 2], Sampling(max_tokens=2))


def test_a_misnamed_registration_uses_the_one_served_model(pool: BackendPool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_routing, "_served_names", {})
    pool.register("http://a:8000", "tiny")
    models: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "served-name"}]})
        model = json.loads(request.content).get("model")
        models.append(model)
        if model != "served-name":
            return httpx.Response(404, json={"error": {"message": f"The model `{model}` does not exist.",
                                                       "type": "NotFoundError", "param": "model", "code": 404}})
        return httpx.Response(200, json=completion([3], model="served-name"))

    with scripted_client(handler) as client:
        for _ in range(2):
            assert complete_routed(pool, client, "job-1", [1], Sampling(max_tokens=1)).model == "served-name"
    assert models == ["tiny", "served-name", "served-name"], "the served name is remembered per backend"


def test_no_backend_at_all_is_still_no_backend_available(pool: BackendPool) -> None:
    with scripted_client(lambda request: httpx.Response(500)) as client, pytest.raises(NoBackendAvailable):
        complete_routed(pool, client, "job-1", [1], Sampling(max_tokens=1))


def test_a_reloaded_policy_version_is_followed(pool: BackendPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU backend serves its policy version as the model name; a weight reload renames it."""
    monkeypatch.setattr(llm_routing, "_served_names", {})
    pool.register("http://a:8000", "policy-0")
    current = {"name": "policy-0"}
    models: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": current["name"]}]})
        model = json.loads(request.content).get("model")
        models.append(model)
        if model != current["name"]:
            return httpx.Response(404, json={"error": {"message": "no such model", "code": 404}})
        return httpx.Response(200, json=completion([3], model=current["name"]))

    with scripted_client(handler) as client:
        assert complete_routed(pool, client, "job-1", [1], Sampling(max_tokens=1)).model == "policy-0"
        current["name"] = "policy-1"
        assert complete_routed(pool, client, "job-1", [1], Sampling(max_tokens=1)).model == "policy-1"
        current["name"] = "policy-2"
        assert complete_routed(pool, client, "job-1", [1], Sampling(max_tokens=1)).model == "policy-2"
    assert models == ["policy-0", "policy-0", "policy-1", "policy-1", "policy-2"]
