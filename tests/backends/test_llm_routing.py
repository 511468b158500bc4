"""complete_routed against scripted HTTP backends (httpx MockTransport) and a real Redis pool:
what is sent, and how timeouts, garbage and a backend that lost the model fail over."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest
from redis import Redis

import shared.backend_pool.pool as backend_pool
from shared.backend_pool import BackendPool, NoBackendAvailable
from shared.config import Settings
from shared.keys import Keys
from workers.rollout.llm_client import LLMClient
from workers.rollout.llm_completion import Sampling
from workers.rollout.llm_errors import BackendUnavailable, BadBackendResponse
from workers.rollout.llm_routing import complete_routed

Handler = Callable[[httpx.Request], httpx.Response]


def completion(token_ids: list[int], model: str = "policy-v1") -> dict:
    """A GenerateTokensResponse of /inference/v1/generate, as vLLM 0.32 answers it."""
    return {
        "request_id": "generate-tokens-1",
        "model": model,
        "created": 0,
        "output_mode": "tokens",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": token_ids,
                "weight_versions": [{"version": "7", "start": 0, "end": len(token_ids)}],
                "logprobs": {
                    "content": [{"token_id": t, "logprob": -0.5, "rank": 1, "top_logprobs": []} for t in token_ids]
                },
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": len(token_ids), "total_tokens": 2 + len(token_ids)},
    }


@pytest.fixture()
def pool(redis: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> BackendPool:
    # An overloaded vLLM still answers /health with 200: every probe passes.
    monkeypatch.setattr(backend_pool, "probe_health", lambda url, timeout_s, key=None: None)
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


def test_request_names_the_pinned_model_and_states_sampling_in_full(pool: BackendPool) -> None:
    pool.register("http://a:8000", "policy-v1")
    bodies: list[tuple[str, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json=completion([5]))

    with scripted_client(handler) as client:
        sampling = Sampling(max_tokens=4, seed=1, stop=("x",), stop_token_ids=(5,))
        turn = complete_routed(pool, client, "job-1", [1, 2, 3], sampling, model="policy-v1")
    [(path, body)] = bodies
    assert path == "/inference/v1/generate"
    assert body["model"] == "policy-v1" and body["token_ids"] == [1, 2, 3] and body["output_mode"] == "tokens"
    params = body["sampling_params"]
    assert (
        params["logprobs"] == 0 and params["seed"] == 1 and params["stop"] == ["x"] and params["stop_token_ids"] == [5]
    )
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "max_tokens",
        "min_tokens",
        "n",
    ):
        assert name in params, f"{name} is left to the model's generation_config"
    assert turn.model == "policy-v1" and turn.token_ids == [5] and turn.policy_version == "7"


def test_only_backends_of_the_trajectory_model_are_picked(pool: BackendPool) -> None:
    pool.register("http://a:8000", "other-model")
    pool.register("http://b:8000", "policy-v1")
    hosts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        return httpx.Response(200, json=completion([5]))

    with scripted_client(handler) as client:
        for job in ("job-1", "job-2", "job-3"):
            complete_routed(pool, client, job, [1], Sampling(max_tokens=1), model="policy-v1")
    assert hosts == ["b", "b", "b"]
    with scripted_client(handler) as client, pytest.raises(NoBackendAvailable, match="serving model 'nope'"):
        complete_routed(pool, client, "job-4", [1], Sampling(max_tokens=1), model="nope")


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
    with (
        scripted_client(lambda request: httpx.Response(200, text="not json")) as client,
        pytest.raises(BadBackendResponse, match="not JSON"),
    ):
        complete_routed(pool, client, "job-1", [1, 2], Sampling(max_tokens=2))


def test_a_backend_that_no_longer_serves_the_model_is_failed_over_and_marked(pool: BackendPool) -> None:
    """A server restarted with another model answers 404 for the trajectory's: another backend takes the call."""
    for host in ("a", "b"):
        pool.register(f"http://{host}:8000", "policy-v1")
    not_found = {"error": {"message": "The model `policy-v1` does not exist.", "type": "NotFoundError", "code": 404}}
    backends = Backends(lambda request: httpx.Response(404, json=not_found))
    with scripted_client(backends) as client:
        assert complete_routed(pool, client, "job-1", [1, 2], Sampling(max_tokens=2), model="policy-v1").token_ids == [
            7,
            8,
        ]
    bad = next(b for b in pool.backends() if b.url == f"http://{backends.bad_host}:8000")
    assert not bad.healthy and "no longer serves" in bad.unhealthy_reason


def test_no_backend_at_all_is_still_no_backend_available(pool: BackendPool) -> None:
    with scripted_client(lambda request: httpx.Response(500)) as client, pytest.raises(NoBackendAvailable):
        complete_routed(pool, client, "job-1", [1], Sampling(max_tokens=1))


def stream_body(token_ids: list[int], break_after: int | None = None) -> Iterator[bytes]:
    """A GenerateTokensStreamResponse stream as vLLM 0.32 sends it: a chunk a token, the finish and weight versions
    on the last, a usage chunk, [DONE]; with `break_after`, the connection drops after that many tokens."""
    for position, token in enumerate(token_ids):
        if position == break_after:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        last = position == len(token_ids) - 1
        choice = {
            "index": 0,
            "token_ids": [token],
            "logprobs": {"content": [{"token_id": token, "logprob": -0.5}]},
            "finish_reason": "length" if last else None,
            "stop_reason": None,
            "weight_versions": [{"version": "7", "start": 0, "end": len(token_ids)}] if last else None,
        }
        yield f"data: {json.dumps({'request_id': 'r', 'choices': [choice]})}\n\n".encode()
    usage = {"prompt_tokens": 2, "completion_tokens": len(token_ids), "total_tokens": 2 + len(token_ids)}
    yield f"data: {json.dumps({'request_id': 'r', 'choices': [], 'usage': usage})}\n\n".encode()
    yield b"data: [DONE]\n\n"


class StreamingBackends(Backends):
    """Two scripted backends that stream [7, 8]; the first one called misbehaves as `bad` says."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        answer = super().__call__(request)
        if request.url.host == self.bad_host:
            return answer
        return httpx.Response(200, content=stream_body([7, 8]), headers={"content-type": "text/event-stream"})


def test_a_streamed_call_is_the_completion_an_unstreamed_one_is(pool: BackendPool) -> None:
    pool.register("http://a:8000", "policy-v1")
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if body["stream"]:
            return httpx.Response(200, content=stream_body([5, 6, 9]))
        return httpx.Response(200, json=completion([5, 6, 9]))

    chunks: list[list[int]] = []
    with scripted_client(handler) as client:
        whole = complete_routed(pool, client, "job-1", [1, 2], Sampling(max_tokens=3), model="policy-v1")
        streamed = complete_routed(
            pool, client, "job-1", [1, 2], Sampling(max_tokens=3), model="policy-v1", on_tokens=chunks.append
        )
    assert chunks == [[5], [6], [9]], "each chunk's tokens are handed on as they come"
    assert bodies[1]["stream"] and bodies[1]["stream_options"] == {"include_usage": True}
    assert {**bodies[1], "stream": False, "stream_options": None} == {**bodies[0], "stream_options": None}
    for name in ("token_ids", "logprobs", "finish_reason", "stop_reason", "weight_versions", "model", "prompt_tokens"):
        assert getattr(streamed, name) == getattr(whole, name), name


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda r: httpx.Response(200, content=stream_body([3, 4], break_after=0)), id="dies-at-once"),
        pytest.param(
            lambda r: httpx.Response(200, content=[b'data: {"error": {"message": "engine dead", "code": 500}}\n\n']),
            id="error-chunk",
        ),
        pytest.param(lambda r: httpx.Response(503, json={"error": {"message": "overloaded"}}), id="503"),
    ],
)
def test_a_stream_that_fails_before_its_first_token_fails_over(pool: BackendPool, bad: Handler) -> None:
    for host in ("a", "b"):
        pool.register(f"http://{host}:8000", "policy-v1")
    backends = StreamingBackends(bad)
    chunks: list[list[int]] = []
    with scripted_client(backends) as client:
        turn = complete_routed(pool, client, "job-1", [1, 2], Sampling(max_tokens=2), on_tokens=chunks.append)
    assert turn.token_ids == [7, 8] and chunks == [[7], [8]], "only the other backend's tokens were handed on"


def test_a_stream_that_breaks_after_its_first_token_is_raised_not_failed_over(pool: BackendPool) -> None:
    for host in ("a", "b"):
        pool.register(f"http://{host}:8000", "policy-v1")
    backends = StreamingBackends(lambda r: httpx.Response(200, content=stream_body([3, 4, 5], break_after=2)))
    chunks: list[list[int]] = []
    with (
        scripted_client(backends) as client,
        pytest.raises(BackendUnavailable, match="the stream broke"),
    ):
        complete_routed(pool, client, "job-1", [1, 2], Sampling(max_tokens=3), on_tokens=chunks.append)
    assert chunks == [[3], [4]] and len(backends.requests) == 1, "no second backend: the caller has its tokens"


def test_a_stream_without_a_finish_is_a_bad_response(pool: BackendPool) -> None:
    pool.register("http://a:8000", "policy-v1")
    cut = [line for line in stream_body([5]) if b"finish_reason" not in line]
    with (
        scripted_client(lambda r: httpx.Response(200, content=cut)) as client,
        pytest.raises(BadBackendResponse, match="without a finish reason"),
    ):
        complete_routed(pool, client, "job-1", [1], Sampling(max_tokens=1), on_tokens=lambda ids: None)
