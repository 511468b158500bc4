"""The CPU backend and the client both keep to vLLM's OpenAI-compatible protocol as vLLM documents it.

The field lists below are transcribed from vLLM's protocol models
(vllm/entrypoints/openai/completion/protocol.py: CompletionRequest, CompletionLogProbs,
CompletionResponseChoice, CompletionResponse; vllm/entrypoints/openai/protocol.py:
ModelCard, ModelList, ErrorResponse) and its metrics docs (docs.vllm.ai, usage/metrics).
"""

from __future__ import annotations

import httpx
import pytest

from backend_procs import CpuBackendProcess
from workers.rollout.llm_client import Sampling, request_body

# vLLM CompletionRequest fields (OpenAI ones, then vLLM's sampling and extra params).
VLLM_REQUEST_FIELDS = {
    "model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
    "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
    "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids", "prompt_logprobs",
    "prompt_embeds", "add_special_tokens", "response_format", "structured_outputs", "priority", "request_id",
    "logits_processors", "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "kv_transfer_params",
    "vllm_xargs",
}
RESPONSE_FIELDS = {"id", "object", "created", "model", "choices", "usage"}
CHOICE_FIELDS = {"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids"}
LOGPROBS_FIELDS = {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
USAGE_FIELDS = {"prompt_tokens", "total_tokens", "completion_tokens"}
MODEL_CARD_FIELDS = {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
ERROR_FIELDS = {"message", "type", "param", "code"}
VLLM_METRICS = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
]


@pytest.fixture(scope="module")
def http(cpu_backend: CpuBackendProcess) -> httpx.Client:
    with httpx.Client(base_url=cpu_backend.url, timeout=60) as client:
        yield client


def complete(http: httpx.Client, **body: object) -> httpx.Response:
    return http.post("/v1/completions", json=body)


def test_client_sends_only_documented_vllm_fields() -> None:
    """The body as the client builds it; the body complete_routed really sends (with the pinned
    backend's model) is checked against the same field list in test_llm_routing.py."""
    body = request_body([1, 2, 3], Sampling(max_tokens=4, seed=1, stop=("x",), stop_token_ids=(5,)))
    assert set(body) <= VLLM_REQUEST_FIELDS
    assert body["prompt"] == [1, 2, 3] and body["logprobs"] == 0
    assert body["return_tokens_as_token_ids"] is True and body["return_token_ids"] is True


def test_completion_response_shape(http: httpx.Client) -> None:
    response = complete(http, prompt=[104, 105], max_tokens=5, logprobs=2, seed=0, ignore_eos=True,
                        return_token_ids=True, return_tokens_as_token_ids=True)
    assert response.status_code == 200
    data = response.json()
    assert RESPONSE_FIELDS <= set(data) and data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    assert isinstance(data["created"], int)
    assert USAGE_FIELDS <= set(data["usage"])
    assert data["usage"]["completion_tokens"] == 5 and data["usage"]["total_tokens"] == 7
    [choice] = data["choices"]
    assert CHOICE_FIELDS <= set(choice) and choice["index"] == 0
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert choice["prompt_token_ids"] == [104, 105] and len(choice["token_ids"]) == 5
    logprobs = choice["logprobs"]
    assert LOGPROBS_FIELDS <= set(logprobs)
    assert logprobs["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(v <= 0 for v in logprobs["token_logprobs"])
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
    for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
        assert top[token] == logprob, "the sampled token is always among top_logprobs"
        assert 2 <= len(top) <= 3


def test_text_tokens_when_not_asked_for_ids(http: httpx.Client) -> None:
    choice = complete(http, prompt=[104], max_tokens=3, logprobs=0, ignore_eos=True).json()["choices"][0]
    assert "token_ids" not in choice or choice["token_ids"] is None
    assert not any(t.startswith("token_id:") for t in choice["logprobs"]["tokens"])
    # Text tokens are per-token decodes (a lone byte of a UTF-8 character shows as U+FFFD), which is
    # why the client asks for token ids instead; offsets still follow the token strings.
    tokens, offsets = choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]
    assert len(tokens) == 3 and offsets == [0, len(tokens[0]), len(tokens[0]) + len(tokens[1])]


def test_batched_prompts_n_and_text_prompt(http: httpx.Client) -> None:
    data = complete(http, prompt=[[104, 105], [106]], n=2, max_tokens=2, ignore_eos=True).json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2, 3]
    text = complete(http, prompt="hello", max_tokens=2, ignore_eos=True).json()
    assert text["usage"]["prompt_tokens"] == 5
    assert complete(http, prompt=[104], max_tokens=1, some_future_vllm_field=1).status_code == 200


def test_errors_use_vllms_error_response(http: httpx.Client) -> None:
    too_long = complete(http, prompt=[104] * 10, max_tokens=5000)
    assert too_long.status_code == 400
    error = too_long.json()["error"]
    assert ERROR_FIELDS <= set(error) and error["code"] == 400 and "maximum context length" in error["message"]
    bad = complete(http, prompt=[104], temperature=-1)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
    unknown = complete(http, prompt=[104], model="nope")
    assert unknown.status_code == 404 and ERROR_FIELDS <= set(unknown.json()["error"])


def test_models_health_and_metrics(http: httpx.Client) -> None:
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert MODEL_CARD_FIELDS <= set(card) and card["object"] == "model" and card["max_model_len"] == 2048
    health = http.get("/health")
    assert health.status_code == 200 and health.content == b""
    complete(http, prompt=[104, 105, 106], max_tokens=2)
    complete(http, prompt=[104, 105, 106, 107], max_tokens=2)
    text = http.get("/metrics").text
    for name in VLLM_METRICS:
        assert f"\n{name}{{" in text, name
    assert f'model_name="{card["id"]}"' in text
    hits = next(line for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total"))
    assert float(hits.rsplit(" ", 1)[1]) > 0
