"""A node gateway in front of the session's real vLLM server (loopback, dev mode on), as a cluster
neighbour and as the service call it: keys, routes, control bodies, sizes, streaming.

The session server is shared, so nothing here changes what it serves: the one reload is of the
model's own weights, and a pause is always resumed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from cli.embedded_redis import free_port
from gateway.app import GatewayConfig
from gateway.server import gateway_server
from shared.config import Settings
from shared.thread_server import ThreadServer
from tests.support.vllm_server import SERVED_NAME

pytestmark = pytest.mark.vllm

DATA, ADMIN = "data-key-for-tests", "admin-key-for-tests"
PROMPT = [(5 * i) % 200 + 40 for i in range(40)]


@dataclass
class Gateway:
    url: str
    upstream: str  # vLLM itself, on loopback
    roots: Path
    max_control_bytes: int


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def gateway(vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    roots = tmp_path_factory.mktemp("checkpoints")
    settings = Settings(
        backend_token=DATA, backend_admin_token=ADMIN, checkpoint_roots=[str(roots)], max_weight_bytes=1024 * 1024
    )
    config = GatewayConfig.from_settings(vllm_server.url, settings)
    server = gateway_server(config, "127.0.0.1", free_port()).start()
    yield Gateway(server.url, vllm_server.url, roots, config.max_control_bytes)
    server.stop()


def paused(upstream: str) -> bool:
    return httpx.get(f"{upstream}/is_paused", timeout=10).json()["is_paused"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/health"),
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/inference/v1/generate"),
        ("POST", "/pause"),
        ("POST", "/collective_rpc"),
        ("POST", "/sleep"),
        ("GET", "/is_paused"),
    ],
)
@pytest.mark.parametrize("key", [None, "wrong"])
def test_without_a_valid_key_every_route_is_401(gateway: Gateway, method: str, path: str, key: str | None) -> None:
    response = httpx.request(method, gateway.url + path, headers=auth(key) if key else {}, timeout=10)
    assert response.status_code == 401, response.text
    assert response.json()["error"]["type"] == "authentication_error"
    assert not paused(gateway.upstream)


@pytest.mark.parametrize(
    "path",
    ["/pause", "/resume", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/v1/load_lora_adapter"],
)
def test_the_data_key_opens_no_control_route(gateway: Gateway, path: str) -> None:
    response = httpx.post(gateway.url + path, headers=auth(DATA), params={"mode": "keep"}, timeout=10)
    assert response.status_code == 403 and "ROLLOUTS_BACKEND_ADMIN_TOKEN" in response.text, response.text
    assert not paused(gateway.upstream)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/sleep"),
        ("POST", "/reset_mm_cache"),
        ("GET", "/is_paused"),
        ("POST", "/start_profile"),
        ("POST", "/v1/unload_lora_adapter"),
        ("GET", "/server_info"),
        ("POST", "/scale_elastic_ep"),
    ],
)
def test_routes_it_does_not_forward_are_404_even_to_the_admin(gateway: Gateway, method: str, path: str) -> None:
    response = httpx.request(method, gateway.url + path, headers=auth(ADMIN), timeout=10)
    assert response.status_code == 404 and path in response.text, response.text


def completion(url: str, key: str | None, **extra: object) -> httpx.Response:
    body = {
        "model": SERVED_NAME,
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0.0,
        "logprobs": 0,
        "return_token_ids": True,
        **extra,
    }
    return httpx.post(f"{url}/v1/completions", json=body, headers=auth(key) if key else {}, timeout=120)


def test_the_data_key_samples_exactly_what_vllm_samples(gateway: Gateway) -> None:
    direct = completion(gateway.upstream, None).json()["choices"][0]
    through = completion(gateway.url, DATA)
    assert through.status_code == 200, through.text
    choice = through.json()["choices"][0]
    assert choice["token_ids"] == direct["token_ids"]
    assert choice["logprobs"]["token_logprobs"] == direct["logprobs"]["token_logprobs"]
    for path in ("/health", "/v1/models", "/metrics"):
        assert httpx.get(gateway.url + path, headers=auth(DATA), timeout=10).status_code == 200, path


def test_a_streamed_completion_arrives_as_vllm_wrote_it(gateway: Gateway) -> None:
    direct = completion(gateway.upstream, None).json()["choices"][0]["text"]
    body = {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, headers=auth(DATA), timeout=120) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) > 2, events
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == direct


class StallingStream:
    """A test double of a streaming backend: it writes one event, then holds the rest until `release`;
    `ended` is set when its answer ends, finished or cut off by the caller going away."""

    def __init__(self) -> None:
        self.release, self.ended = threading.Event(), threading.Event()

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b"data: first\n\n"
                while not self.release.is_set():  # an asyncio-friendly wait: the double serves nothing else
                    await asyncio.sleep(0.01)
                yield b"data: [DONE]\n\n"
            finally:
                self.ended.set()

        async def endpoint(_request) -> StreamingResponse:  # type: ignore[no-untyped-def]
            return StreamingResponse(events(), media_type="text/event-stream")

        app = Starlette(routes=[Route("/v1/completions", endpoint, methods=["POST"])])
        self.server = ThreadServer(app, "127.0.0.1", free_port()).start()
        config = GatewayConfig.from_settings(self.server.url, Settings(backend_token=DATA, backend_admin_token=ADMIN))
        self.gateway = gateway_server(config, "127.0.0.1", free_port()).start()

    def stop(self) -> None:
        self.release.set()
        self.gateway.stop()
        self.server.stop()


@pytest.fixture()
def stalling() -> Iterator[StallingStream]:
    double = StallingStream()
    yield double
    double.stop()


def test_a_stream_is_passed_on_before_the_backend_finishes_it(stalling: StallingStream) -> None:
    """The first event must reach the caller while the backend's answer is still open (nothing buffers it)."""
    url = f"{stalling.gateway.url}/v1/completions"
    with httpx.stream("POST", url, json={}, headers=auth(DATA), timeout=60) as answer:
        lines = answer.iter_lines()
        assert next(lines) == "data: first" and not stalling.ended.is_set()
        stalling.release.set()
        assert [line for line in lines if line] == ["data: [DONE]"]


def test_a_caller_that_goes_away_ends_the_call_upstream(stalling: StallingStream) -> None:
    """A cancelled job's worker closes its connection mid-generation: the backend's answer must end too (vLLM
    aborts a request whose connection closes), not run on for nobody."""
    url = f"{stalling.gateway.url}/v1/completions"
    with httpx.stream("POST", url, json={}, headers=auth(DATA), timeout=60) as answer:
        assert next(answer.iter_lines()) == "data: first"
    assert stalling.ended.wait(30), "the backend's answer went on after the caller left"
    assert not stalling.release.is_set()


def test_the_admin_key_pauses_and_resumes(gateway: Gateway) -> None:
    try:
        response = httpx.post(f"{gateway.url}/pause", params={"mode": "keep"}, headers=auth(ADMIN), timeout=30)
        assert response.status_code == 200, response.text
        assert paused(gateway.upstream)
    finally:
        httpx.post(f"{gateway.url}/resume", headers=auth(ADMIN), timeout=30)
    assert not paused(gateway.upstream)


def test_a_reload_outside_the_roots_never_reaches_vllm_and_it_keeps_serving(gateway: Gateway, tmp_path: Path) -> None:
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path)}}
    response = httpx.post(f"{gateway.url}/collective_rpc", json=body, headers=auth(ADMIN), timeout=30)
    assert response.status_code == 403 and str(tmp_path) in response.text, response.text
    assert completion(gateway.url, DATA).status_code == 200


def test_a_reload_from_under_a_root_is_forwarded(gateway: Gateway, tiny_model: Path) -> None:
    checkpoint = gateway.roots / "same-weights"
    if not checkpoint.exists():
        shutil.copytree(tiny_model, checkpoint)  # the served weights again: the shared server serves the same
    before = completion(gateway.upstream, None).json()["choices"][0]["token_ids"]
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint)}}
    response = httpx.post(f"{gateway.url}/collective_rpc", json=body, headers=auth(ADMIN), timeout=300)
    assert response.status_code == 200, response.text
    assert completion(gateway.url, DATA).json()["choices"][0]["token_ids"] == before


def test_an_upload_past_the_limit_is_413_whether_or_not_it_says_its_size(gateway: Gateway) -> None:
    huge = b'{"method": "load_weights_from_bytes", "kwargs": {"data": "' + b"A" * gateway.max_control_bytes + b'"}}'
    declared = httpx.post(f"{gateway.url}/collective_rpc", content=huge, headers=auth(ADMIN), timeout=60)
    assert declared.status_code == 413, declared.text

    def undeclared() -> Iterator[bytes]:  # chunked: no Content-Length to refuse it by
        for start in range(0, len(huge), 1 << 20):
            yield huge[start : start + (1 << 20)]

    streamed = httpx.post(f"{gateway.url}/collective_rpc", content=undeclared(), headers=auth(ADMIN), timeout=60)
    assert streamed.status_code == 413, streamed.text
    assert completion(gateway.url, DATA).status_code == 200
