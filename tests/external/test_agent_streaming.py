"""Real streaming on a job's endpoint, on the scripted backend double (which streams as vLLM's generate route does):
text reaches the agent while the backend is still generating, the record is the one an unstreamed call makes, a
tool call's text is held back for the call, and a backend that dies mid-stream ends the stream with the format's
error and leaves the record as it was. The same against real vLLM is in test_agent_formats_on_vllm.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from shared.external_agent_tokens import CONVERSATION_HEADER
from tests.external.conftest import Endpoint, serve
from tests.external.test_agent_formats import GOOD, SYSTEM
from tests.support.scripted_llm import SCRIPTED_MODEL, ScriptedLLM
from tests.support.trajectory_checks import assert_exact_against_backend

REPLY = "Hello there, how are you?"


@pytest.fixture()
def scripted(tokenizer: Any) -> Iterator[ScriptedLLM]:
    scripts = {"slow": [REPLY], "dies": [REPLY], "tool": [f"Let me look. {GOOD}"], "hi": [REPLY]}
    llm = ScriptedLLM(tokenizer, scripts=scripts, holds={"slow": threading.Event()}, breaks={"dies": 3}).start()
    yield llm
    llm.stop()


@pytest.fixture()
def endpoint(tokenizer: Any, scripted: ScriptedLLM) -> Iterator[Endpoint]:
    yield from serve(tokenizer, scripted.url, SCRIPTED_MODEL, None, max_tokens_per_turn=200)


@pytest.fixture()
def twin(tokenizer: Any, scripted: ScriptedLLM) -> Iterator[Endpoint]:
    """A second job on the same backend, to make the same calls unstreamed."""
    yield from serve(tokenizer, scripted.url, SCRIPTED_MODEL, None, job_id="job-twin", max_tokens_per_turn=200)


def chat(endpoint: Endpoint) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=endpoint.key, max_retries=0)


def messages(script: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Hi. [script:{script}]"}]


def test_text_reaches_the_agent_while_the_backend_is_still_generating(
    endpoint: Endpoint, scripted: ScriptedLLM
) -> None:
    stream = chat(endpoint).chat.completions.create(model=SCRIPTED_MODEL, messages=messages("slow"), stream=True)
    texts: list[str] = []
    for chunk in stream:
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta and not scripted.holds["slow"].is_set():
            assert scripted.streams_done == 0, "the first text came before the backend's stream ended"
            scripted.holds["slow"].set()  # the backend goes on only now
        texts.append(delta or "")
    assert "".join(texts) == REPLY and scripted.streams_done == 1
    assert len([t for t in texts if t]) > 1, "the text came in pieces, as the tokens did"


@pytest.mark.parametrize("script", ["hi", "tool"])
def test_a_streamed_call_records_what_an_unstreamed_one_does(endpoint: Endpoint, twin: Endpoint, script: str) -> None:
    stream = chat(endpoint).chat.completions.create(model=SCRIPTED_MODEL, messages=messages(script), stream=True)
    chunks = list(stream)
    whole = chat(twin).chat.completions.create(model=SCRIPTED_MODEL, messages=messages(script))
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed_text == (whole.choices[0].message.content or "")
    assert "<tool_call>" not in streamed_text, "a tool call's text is held back for the call"
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []
    ]
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    one, other = endpoint.session.record(), twin.session.record()
    assert (one.token_ids, one.logprobs, one.loss_mask) == (other.token_ids, other.logprobs, other.loss_mask)
    assert_exact_against_backend(one, endpoint.served)


def test_a_backend_dying_mid_stream_ends_each_formats_stream_with_its_error(endpoint: Endpoint) -> None:
    with pytest.raises(openai.APIError, match="the model could not answer"):
        list(chat(endpoint).chat.completions.create(model=SCRIPTED_MODEL, messages=messages("dies"), stream=True))
    claude = anthropic.Anthropic(base_url=endpoint.url, api_key=endpoint.key, max_retries=0)
    with (
        pytest.raises(anthropic.APIStatusError) as failed,
        claude.messages.stream(
            model=SCRIPTED_MODEL, max_tokens=64, system=SYSTEM, messages=[{"role": "user", "content": "[script:dies]"}]
        ) as events,
    ):
        events.get_final_message()
    assert failed.value.body["error"]["type"] == "api_error"
    events = list(chat(endpoint).responses.create(model=SCRIPTED_MODEL, input="[script:dies]", stream=True))
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert "output_text.delta" in " ".join(e.type for e in events), "the failure came after text was streamed"
    record = endpoint.session.record()
    assert record.token_ids == [] and record.segments == [], "a call that failed mid-stream left no turn behind"
    # The agent's retry (the backend no longer dies) is recorded once, as if the failed call never was.
    del endpoint.served[:]
    chat(endpoint).chat.completions.create(model=SCRIPTED_MODEL, messages=messages("hi"), stream=True).close()
    record = endpoint.session.record()
    assert record.counts.turns == 1 and record.segments == []
    assert_exact_against_backend(record, endpoint.served)


def test_a_call_waiting_behind_a_stream_leaves_the_endpoint_answering(
    endpoint: Endpoint, scripted: ScriptedLLM
) -> None:
    """Another conversation's unstreamed call waits for the session in the thread pool, not on the server's
    loop: the loop goes on serving (the stream's chunks, other routes) while the stream holds the session."""
    stream = chat(endpoint).chat.completions.create(model=SCRIPTED_MODEL, messages=messages("slow"), stream=True)
    chunks = iter(stream)
    next(chunks)  # the stream is open: its call holds the session, its backend held after the first token
    other = threading.Thread(
        target=lambda: chat(endpoint).chat.completions.create(
            model=SCRIPTED_MODEL, messages=messages("hi"), extra_headers={CONVERSATION_HEADER: "other"}
        )
    )
    other.start()
    time.sleep(1.0)  # let it reach the endpoint and wait for the session
    assert endpoint.session.busy
    listed = httpx.get(f"{endpoint.url}/v1/models", headers={"Authorization": f"Bearer {endpoint.key}"}, timeout=30)
    assert listed.status_code == 200, "the endpoint's loop answered while a call waited behind the stream"
    scripted.holds["slow"].set()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).endswith("you?")
    other.join(timeout=60)
    assert not other.is_alive()
    assert {s["conversation"] for s in endpoint.session.record().segments} | {
        endpoint.session.record().conversation
    } == {"c0", "other"}
