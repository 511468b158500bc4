"""The token-in/token-out client against a real vLLM server: token IDs, logprobs, sampling, weight versions."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import httpx
import pytest
import torch

from cli.embedded_redis import free_port
from cli.tiny_model import load
from cli.vllm_server import VLLMServer
from workers.rollout.llm_client import LLMClient
from workers.rollout.llm_completion import Sampling
from workers.rollout.llm_errors import BackendRequestError, BackendUnavailable, BadBackendResponse


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path):
    return load(tiny_model_dir)


@pytest.fixture()
def client() -> LLMClient:
    with LLMClient(request_timeout_s=120, connect_timeout_s=2, max_retries=2, backoff_s=0.01) as c:
        yield c


def chat_prompt(tokenizer, text: str) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    )


def test_token_ids_and_logprobs_match_an_independent_forward_pass(
    vllm_server: VLLMServer, client: LLMClient, model
) -> None:
    tokenizer, lm = model
    prompt = chat_prompt(tokenizer, "What is 2 + 2?")
    result = client.complete(
        vllm_server.url, prompt, Sampling(max_tokens=12, seed=7, ignore_eos=True), backend_id="b-test", model="tiny"
    )
    assert len(result.token_ids) == len(result.logprobs) == 12
    assert result.finish_reason == "length" and result.backend_id == "b-test"
    assert result.model == "tiny", "the backend reports the model it serves"
    with torch.no_grad():
        logits = lm(input_ids=torch.tensor([prompt + result.token_ids])).logits[0]
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
    for i, (token, logprob) in enumerate(zip(result.token_ids, result.logprobs)):
        assert logprob == pytest.approx(float(expected[i, token]), abs=1e-3), f"position {i}"


def test_every_turn_records_the_weight_version_vllm_reports(vllm_server: VLLMServer, client: LLMClient) -> None:
    result = client.complete(vllm_server.url, [257, 104, 105], Sampling(max_tokens=5, ignore_eos=True), model="tiny")
    assert [(s.start, s.end) for s in result.weight_versions] == [(0, 5)]
    assert result.policy_version == result.weight_versions[0].version == "default"  # vLLM's label before any update


def test_seed_makes_sampling_repeatable(vllm_server: VLLMServer, client: LLMClient, model) -> None:
    prompt = chat_prompt(model[0], "seeded")
    runs = [
        client.complete(vllm_server.url, prompt, Sampling(max_tokens=8, seed=s, ignore_eos=True)).token_ids
        for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_stop_token_ids_end_the_turn_with_a_stop_reason(vllm_server: VLLMServer, client: LLMClient, model) -> None:
    prompt = chat_prompt(model[0], "stop here")
    greedy = client.complete(vllm_server.url, prompt, Sampling(max_tokens=4, temperature=0, ignore_eos=True))
    stop_at = greedy.token_ids[1]
    stopped = client.complete(
        vllm_server.url, prompt, Sampling(max_tokens=4, temperature=0, ignore_eos=True, stop_token_ids=(stop_at,))
    )
    assert stopped.token_ids == greedy.token_ids[: greedy.token_ids.index(stop_at) + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_at


def test_a_stop_string_stops_the_turn_and_keeps_its_tokens(vllm_server: VLLMServer, client: LLMClient, model) -> None:
    tokenizer = model[0]
    prompt = chat_prompt(tokenizer, "a stop string")
    greedy = client.complete(vllm_server.url, prompt, Sampling(max_tokens=64, temperature=0, ignore_eos=True))
    # The byte-level tokenizer's token id is the byte: take two printable ASCII tokens in a row.
    pairs = [i for i in range(1, len(greedy.token_ids) - 1) if all(33 <= t <= 126 for t in greedy.token_ids[i : i + 2])]
    if not pairs:
        pytest.skip("the greedy reply has no two printable ASCII bytes in a row")
    text = tokenizer.decode(greedy.token_ids[pairs[0] : pairs[0] + 2])
    stopped = client.complete(
        vllm_server.url, prompt, Sampling(max_tokens=64, temperature=0, ignore_eos=True, stop=(text,))
    )
    assert stopped.finish_reason == "stop" and stopped.stop_reason == text
    assert stopped.token_ids == greedy.token_ids[: len(stopped.token_ids)]
    assert tokenizer.decode(stopped.token_ids).endswith(text), "the record keeps the tokens that matched"


def test_penalties_reach_vllm_and_change_sampling(vllm_server: VLLMServer, client: LLMClient, model) -> None:
    """Neutral by default (greedy is the model's argmax); a penalty the job sets is applied by vLLM."""
    prompt = chat_prompt(model[0], "repeat repeat repeat")
    neutral = client.complete(vllm_server.url, prompt, Sampling(max_tokens=24, temperature=0, ignore_eos=True))
    penalised = client.complete(
        vllm_server.url,
        prompt,
        Sampling(max_tokens=24, temperature=0, ignore_eos=True, repetition_penalty=5.0, presence_penalty=2.0),
    )
    assert neutral.token_ids != penalised.token_ids


def test_4xx_raises_with_the_backend_message(vllm_server: VLLMServer, client: LLMClient) -> None:
    with pytest.raises(BackendRequestError) as err:
        client.complete(vllm_server.url, [1, 2], Sampling(max_tokens=2), model="no-such-model")
    assert err.value.status == 404 and "does not exist" in err.value.message


def test_without_the_generate_route_the_client_uses_v1_completions(vllm_server: VLLMServer, client: LLMClient) -> None:
    """A server started without --enable-scale-out: /v1/completions, token-exact, no weight version."""
    proxy = FlakyProxy(vllm_server.url, failures=0, missing_paths=("/inference/v1/generate",))
    try:
        sampling = Sampling(max_tokens=6, seed=5, ignore_eos=True)
        via_completions = client.complete(proxy.url, [257, 104, 105], sampling, model="tiny")
        direct = client.complete(vllm_server.url, [257, 104, 105], sampling, model="tiny")
        assert via_completions.token_ids == direct.token_ids
        assert via_completions.logprobs == pytest.approx(direct.logprobs, abs=1e-4)
        assert via_completions.weight_versions == () and direct.weight_versions
        assert proxy.paths == ["/inference/v1/generate", "/v1/completions"]
        client.complete(proxy.url, [257, 104], Sampling(max_tokens=2), model="tiny")
        assert proxy.paths[-1] == "/v1/completions", "the missing route is remembered per backend"
    finally:
        proxy.close()


def test_connection_errors_are_retried_then_reported(client: LLMClient) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(BackendUnavailable) as err:
        client.complete(url, [1, 2], Sampling(max_tokens=2), backend_id="b-dead")
    assert "after 3 attempts" in str(err.value) and err.value.backend_id == "b-dead"


class FlakyProxy:
    """A test double in front of the real server: 503 to the first `failures` requests, 404 on `missing_paths`."""

    def __init__(self, upstream: str, failures: int, missing_paths: tuple[str, ...] = ()) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                proxy.seen += 1
                proxy.paths.append(self.path)
                if self.path in missing_paths:  # FastAPI's answer for a route it does not have
                    status, payload = 404, b'{"detail": "Not Found"}'
                elif proxy.seen <= failures:
                    status, payload = 503, b'{"error": {"message": "overloaded", "type": "x", "code": 503}}'
                else:
                    upstream_response = httpx.post(
                        upstream + self.path, content=body, headers={"content-type": "application/json"}, timeout=60
                    )
                    status, payload = upstream_response.status_code, upstream_response.content
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.seen = 0
        self.paths: list[str] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("failures", "succeeds"), [(2, True), (3, False)])
def test_5xx_is_retried_with_backoff(vllm_server: VLLMServer, client: LLMClient, failures: int, succeeds: bool) -> None:
    proxy = FlakyProxy(vllm_server.url, failures)
    try:
        if succeeds:
            result = client.complete(proxy.url, [104, 105], Sampling(max_tokens=3, ignore_eos=True))
            assert result.attempts == 3 and len(result.token_ids) == 3
        else:
            with pytest.raises(BackendUnavailable) as err:
                client.complete(proxy.url, [104, 105], Sampling(max_tokens=3))
            assert "503: overloaded" in str(err.value)
        assert proxy.seen == 3, "max_retries=2: three attempts in all"
    finally:
        proxy.close()


def scripted(payload: object, status: int = 200) -> LLMClient:
    """A client whose every request gets `payload` (the /v1/completions shape: the generate route is "missing")."""
    client = LLMClient(max_retries=0)
    client._no_generate_route.add("http://b")
    client._http.close()
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    client._http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(status, content=content)))
    return client


def response_with(token_ids: list[int] | None, tokens: list[object]) -> dict:
    choice = {
        "index": 0,
        "text": "",
        "finish_reason": "length",
        "stop_reason": None,
        "logprobs": {"tokens": tokens, "token_logprobs": [-1.0] * len(tokens)},
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"model": "m", "choices": [choice], "usage": {"prompt_tokens": 1}}


def test_a_2xx_that_is_not_json_is_a_bad_backend_response() -> None:
    with (
        scripted(b"<html>502 from a proxy, sent as 200</html>") as client,
        pytest.raises(BadBackendResponse, match="not JSON") as err,
    ):
        client.complete("http://b", [1], Sampling(max_tokens=1), backend_id="b-1")
    assert err.value.backend_id == "b-1"


@pytest.mark.parametrize("tokens", [[None, "token_id:2"], [3, 4], [{"t": 1}, "token_id:2"]])
def test_non_string_tokens_are_a_bad_backend_response(tokens: list[object]) -> None:
    with scripted(response_with(None, tokens)) as client, pytest.raises(BadBackendResponse):
        client.complete("http://b", [1], Sampling(max_tokens=2))


def test_non_string_tokens_next_to_token_ids_are_tolerated() -> None:
    with scripted(response_with([5, 6], [None, "x"])) as client:
        assert client.complete("http://b", [1], Sampling(max_tokens=2)).token_ids == [5, 6]


def test_token_ids_are_cross_checked_against_token_id_strings() -> None:
    with scripted(response_with([5, 6], ["token_id:5", "token_id:6"])) as client:
        assert client.complete("http://b", [1], Sampling(max_tokens=2)).token_ids == [5, 6]
    with (
        scripted(response_with([5, 6], ["token_id:5", "token_id:9"])) as client,
        pytest.raises(BadBackendResponse, match="disagree"),
    ):
        client.complete("http://b", [1], Sampling(max_tokens=2))


def generate_response(token_ids: list[int], content: list[dict], spans: list[dict] | None = None) -> dict:
    choice = {
        "index": 0,
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": token_ids,
        "logprobs": {"content": content},
        "weight_versions": spans,
    }
    return {"model": "m", "choices": [choice], "usage": {"prompt_tokens": 1}}


def generate_client(payload: dict) -> LLMClient:
    client = LLMClient(max_retries=0)
    client._http.close()
    client._http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, json=payload)))
    return client


def test_generate_logprobs_must_line_up_with_the_token_ids() -> None:
    good = [{"token_id": 5, "logprob": -0.5}, {"token_id": 6, "logprob": -1.5}]
    with generate_client(generate_response([5, 6], good, [{"version": "3", "start": 0, "end": 2}])) as client:
        result = client.complete("http://b", [1], Sampling(max_tokens=2))
    assert result.logprobs == [-0.5, -1.5] and result.policy_version == "3"
    for content in (good[:1], [good[0], {"token_id": 9, "logprob": -1.0}]):
        with generate_client(generate_response([5, 6], content)) as client, pytest.raises(BadBackendResponse):
            client.complete("http://b", [1], Sampling(max_tokens=2))


def test_sampling_is_stated_in_full_so_generation_config_never_applies() -> None:
    body = Sampling(max_tokens=3).to_request()
    assert body["repetition_penalty"] == 1.0 and body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
    assert body["top_k"] == 0 and body["min_p"] == 0.0 and body["top_p"] == 1.0 and body["temperature"] == 1.0


def test_many_concurrent_seeded_requests_with_long_prompts_keep_the_engine_alive(vllm_server: VLLMServer) -> None:
    """vLLM 0.32's CPU build kills its engine when a seeded request's prefill is chunked; the
    launcher turns chunked prefill off there."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    def prompt(i: int) -> list[int]:
        rng = random.Random(i)
        return [rng.randrange(32, 127) for _ in range(rng.randrange(200, 2500))]

    def run(i: int) -> list[int]:
        with LLMClient(request_timeout_s=300, max_retries=0) as client:
            return client.complete(
                vllm_server.url, prompt(i), Sampling(max_tokens=16, seed=i, ignore_eos=True), model="tiny"
            ).token_ids

    with ThreadPoolExecutor(24) as pool:
        first = list(pool.map(run, range(24)))
    assert all(len(ids) == 16 for ids in first)
    assert len(run(5)) == 16, "the engine lives on"
