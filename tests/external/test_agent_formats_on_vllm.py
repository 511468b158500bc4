"""The unmodified `anthropic` and OpenAI Agents SDKs, each run to its own end against a job's endpoint on real vLLM.

The tiny model writes nonsense; what is tested is that each harness ends its run and that every
call it made is in one token-exact record (tests/support/trajectory_checks.py). The tool-call
round trips themselves are scripted in test_agent_formats.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from cli.vllm_server import VLLMServer
from tests.external.conftest import Endpoint, renderer_for, serve
from tests.external.test_agent_formats import ANTHROPIC_TOOLS, SYSTEM, common_token_ids, run_openai_agents
from tests.support.trajectory_checks import (
    assert_calls_exact_against_backend,
    assert_decodes_to_conversation,
    assert_exact_against_backend,
    recorded_calls,
)
from tests.support.vllm_server import SERVED_NAME
from workers.rollout.external_agent import anthropic_api
from workers.rollout.llm_completion import Sampling

pytestmark = pytest.mark.vllm


@pytest.fixture()
def endpoint(tokenizer: Any, vllm_server: VLLMServer) -> Iterator[Endpoint]:
    yield from serve(tokenizer, vllm_server.url, SERVED_NAME, None)


@pytest.fixture()
def stopping_endpoint(tokenizer: Any, vllm_server: VLLMServer) -> Iterator[Endpoint]:
    """The job's sampling stops on common tokens, so the random model's turns end (see common_token_ids)."""
    sampling = Sampling(max_tokens=32, temperature=1.0, seed=7, stop_token_ids=tuple(common_token_ids(tokenizer)))
    yield from serve(tokenizer, vllm_server.url, SERVED_NAME, None, sampling=sampling)


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_tool_use_loop_on_vllm_is_one_token_exact_record(
    endpoint: Endpoint, tokenizer: Any, stream: bool
) -> None:
    llm = anthropic.Anthropic(base_url=endpoint.url, api_key=endpoint.key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    for _ in range(3):  # the harness's own loop: tool results for tool_use, a nudge otherwise, three turns
        kwargs = {
            "model": SERVED_NAME,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
            "max_tokens": 16,
        }
        if stream:
            with llm.messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = llm.messages.create(**kwargs)
        assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use") and reply.model == SERVED_NAME
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "no tools here"}
            for b in reply.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results or "Go on."})
    httpx.post(f"{endpoint.url}/finish", headers={"x-api-key": endpoint.key})
    record = endpoint.session.record()
    assert record.segments == [] and record.stop_reason == "finish" and record.counts.turns == 3
    assert_exact_against_backend(record, endpoint.served)
    task = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2 + 3?"}]
    assert_decodes_to_conversation(record, renderer_for(tokenizer, anthropic_api.chat_tools(ANTHROPIC_TOOLS)), task)


def test_the_openai_agents_sdk_on_vllm_is_one_token_exact_record(stopping_endpoint: Endpoint) -> None:
    # Runner.run_streamed's path is covered on the scripted backend (test_agent_formats.py); one run here
    ran = run_openai_agents(stopping_endpoint, SERVED_NAME, "What is 2 + 3?")
    assert ran["model_class"] == "OpenAIResponsesModel"
    record = stopping_endpoint.session.record()
    assert_calls_exact_against_backend(record, stopping_endpoint.served)
    assert len(recorded_calls(record)) == len(ran["responses"]) >= 1, "every call the SDK made"
    assert recorded_calls(record)[-1][0].final_text == ran["final_output"] or ran["tool_calls"]
    assert all(call.max_tokens <= 32 for call in stopping_endpoint.served)


@pytest.fixture()
def greedy_pair(tokenizer: Any, vllm_server: VLLMServer) -> Iterator[tuple[Endpoint, Endpoint]]:
    """Two jobs sampling greedily from the same vLLM: one is called streamed, the other not."""
    sampling = Sampling(max_tokens=24, temperature=0.0, seed=7)
    for streamed in serve(tokenizer, vllm_server.url, SERVED_NAME, None, job_id="job-streamed", sampling=sampling):
        for whole in serve(tokenizer, vllm_server.url, SERVED_NAME, None, job_id="job-whole", sampling=sampling):
            yield streamed, whole


@pytest.mark.parametrize("stop", [None, ["e", "a"]])
def test_a_streamed_conversation_on_vllm_records_what_an_unstreamed_one_does(
    greedy_pair: tuple[Endpoint, Endpoint], stop: list[str] | None
) -> None:
    """vLLM streams token ids and logprobs: the same calls streamed and not give the same replies and records,
    stop strings and max_tokens included."""
    streamed, whole = greedy_pair
    clients = [openai.OpenAI(base_url=f"{e.url}/v1", api_key=e.key, max_retries=0) for e in greedy_pair]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Count."}]
    for _ in range(3):
        asked = {"model": SERVED_NAME, "messages": messages, "max_tokens": 16, "stop": stop}
        chunks = list(clients[0].chat.completions.create(**asked, stream=True))
        reply = clients[1].chat.completions.create(**asked)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == (reply.choices[0].message.content or "")
        assert chunks[-1].choices[0].finish_reason == reply.choices[0].finish_reason
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
    one, other = streamed.session.record(), whole.session.record()
    assert one.segments == other.segments == [] and one.counts.turns == 3
    assert (one.token_ids, one.loss_mask) == (other.token_ids, other.loss_mask)
    assert one.logprobs == other.logprobs
    assert [(t.finish_reason, t.stop_reason) for t in one.turns] == [
        (t.finish_reason, t.stop_reason) for t in other.turns
    ]
    assert_exact_against_backend(one, streamed.served)
