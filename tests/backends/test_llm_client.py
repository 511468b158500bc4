"""The vLLM client against a real CPU backend over HTTP: token IDs and logprobs line up."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import httpx
import pytest
import torch

from cpu_backend.bootstrap import load
from shared.embedded_redis import free_port
from workers.rollout.llm_client import (
    BackendRequestError,
    BackendUnavailable,
    BadBackendResponse,
    LLMClient,
    Sampling,
)

from backend_procs import CpuBackendProcess


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path):
    return load(tiny_model_dir)


@pytest.fixture()
def client() -> LLMClient:
    with LLMClient(request_timeout_s=60, connect_timeout_s=2, max_retries=2, backoff_s=0.01) as c:
        yield c


def chat_prompt(tokenizer, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"])


def test_token_ids_and_logprobs_match_an_independent_forward_pass(
    cpu_backend: CpuBackendProcess, client: LLMClient, model, tiny_model_dir: Path
) -> None:
    tokenizer, lm = model
    prompt = chat_prompt(tokenizer, "What is 2 + 2?")
    result = client.complete(cpu_backend.url, prompt, Sampling(max_tokens=12, seed=7, ignore_eos=True),
                             backend_id="b-test")
    assert len(result.token_ids) == len(result.logprobs) == 12
    assert result.finish_reason == "length" and result.backend_id == "b-test"
    assert result.model == tiny_model_dir.name, "the backend reports the model it serves"
    with torch.no_grad():
        logits = lm(input_ids=torch.tensor([prompt + result.token_ids])).logits[0]
    expected = torch.log_softmax(logits[len(prompt) - 1: -1].float(), dim=-1)
    for i, (token, logprob) in enumerate(zip(result.token_ids, result.logprobs)):
        assert logprob == pytest.approx(float(expected[i, token]), abs=1e-4), f"position {i}"
    assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)


def test_seed_makes_sampling_repeatable(cpu_backend: CpuBackendProcess, client: LLMClient, model) -> None:
    prompt = chat_prompt(model[0], "seeded")
    runs = [client.complete(cpu_backend.url, prompt, Sampling(max_tokens=8, seed=s, ignore_eos=True)).token_ids
            for s in (1, 1, 2)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_stop_token_ids_end_the_turn_with_a_stop_reason(cpu_backend: CpuBackendProcess, client: LLMClient,
                                                         model) -> None:
    prompt = chat_prompt(model[0], "greedy")
    greedy = client.complete(cpu_backend.url, prompt, Sampling(max_tokens=4, temperature=0, ignore_eos=True))
    first = greedy.token_ids[0]
    stopped = client.complete(cpu_backend.url, prompt,
                              Sampling(max_tokens=4, temperature=0, stop_token_ids=(first,)))
    assert stopped.token_ids == [first]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", first)


def test_next_turn_on_the_same_backend_reuses_the_prefix(cpu_backend: CpuBackendProcess, client: LLMClient,
                                                         model) -> None:
    tokenizer = model[0]
    prompt = chat_prompt(tokenizer, "turn one of a long trajectory " * 3)
    first = client.complete(cpu_backend.url, prompt, Sampling(max_tokens=6, seed=3, ignore_eos=True))
    observation = list(tokenizer.encode("<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"))
    second = client.complete(cpu_backend.url, prompt + first.token_ids + observation,
                             Sampling(max_tokens=6, seed=3, ignore_eos=True))
    assert second.prompt_tokens == len(prompt) + 6 + len(observation)
    assert second.cached_tokens is not None and second.cached_tokens >= len(prompt) + 5


def test_4xx_raises_with_the_backend_message(cpu_backend: CpuBackendProcess, client: LLMClient) -> None:
    with pytest.raises(BackendRequestError) as err:
        client.complete(cpu_backend.url, [1, 2, 100_000], Sampling(max_tokens=2))
    assert err.value.status == 400 and "out of vocabulary" in str(err.value)
    with pytest.raises(BackendRequestError) as err:
        client.complete(cpu_backend.url, [1, 2], Sampling(max_tokens=2), model="no-such-model")
    assert err.value.status == 404 and "does not exist" in err.value.message


def test_connection_errors_are_retried_then_reported(client: LLMClient) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(BackendUnavailable) as err:
        client.complete(url, [1, 2], Sampling(max_tokens=2), backend_id="b-dead")
    assert "after 3 attempts" in str(err.value) and err.value.backend_id == "b-dead"


class FlakyProxy:
    """A proxy in front of the real backend that answers 503 to the first `failures` requests."""

    def __init__(self, upstream: str, failures: int) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                proxy.seen += 1
                if proxy.seen <= failures:
                    status, payload = 503, b'{"error": {"message": "overloaded", "type": "x", "code": 503}}'
                else:
                    upstream_response = httpx.post(upstream + self.path, content=body,
                                                   headers={"content-type": "application/json"}, timeout=60)
                    status, payload = upstream_response.status_code, upstream_response.content
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.seen = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("failures", "succeeds"), [(2, True), (3, False)])
def test_5xx_is_retried_with_backoff(cpu_backend: CpuBackendProcess, client: LLMClient, failures: int,
                                     succeeds: bool) -> None:
    proxy = FlakyProxy(cpu_backend.url, failures)
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
    client = LLMClient(max_retries=0)
    client._http.close()
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    client._http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(status, content=content)))
    return client


def response_with(token_ids: list[int] | None, tokens: list[object]) -> dict:
    choice = {"index": 0, "text": "", "finish_reason": "length", "stop_reason": None,
              "logprobs": {"tokens": tokens, "token_logprobs": [-1.0] * len(tokens)}}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"model": "m", "choices": [choice], "usage": {"prompt_tokens": 1}}


def test_a_2xx_that_is_not_json_is_a_bad_backend_response() -> None:
    with scripted(b"<html>502 from a proxy, sent as 200</html>") as client:
        with pytest.raises(BadBackendResponse, match="not JSON") as err:
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
    with scripted(response_with([5, 6], ["token_id:5", "token_id:9"])) as client:
        with pytest.raises(BadBackendResponse, match="disagree"):
            client.complete("http://b", [1], Sampling(max_tokens=2))


def test_routed_call_to_a_real_backend_registered_under_another_name(
    cpu_backend: CpuBackendProcess, client: LLMClient, redis, settings, tiny_model_dir: Path
) -> None:
    """A backend registered as "tiny" that serves its model dir's name still answers (with a warning)."""
    from shared.backend_pool import BackendPool
    from shared.keys import Keys
    from workers.rollout.llm_routing import complete_routed

    pool = BackendPool(redis, Keys(settings.redis_prefix), settings)
    pool.register(cpu_backend.url, "tiny")
    turn = complete_routed(pool, client, "job-1", [104, 105], Sampling(max_tokens=2, ignore_eos=True))
    assert turn.model == tiny_model_dir.name and len(turn.token_ids) == 2
    pool.release("job-1")
