"""What the model writes, as the agent gets it: tool calls parsed with the model's parser, malformed ones as text.

The tiny random model almost never writes a tool call, so these replies are scripted by the
suite's test double of a vLLM backend (tests/support/scripted_llm.py); every other property of
the endpoint is tested against real vLLM (test_external_agent_on_vllm.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from shared.external_agent_tokens import CONVERSATION_HEADER
from tests.external.conftest import TOOLS, Endpoint, serve
from tests.support.scripted_llm import SCRIPTED_MODEL, ScriptedLLM
from tests.support.trajectory_checks import assert_decodes_to_conversation, assert_exact_against_backend

GOOD = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
MALFORMED = '<tool_call>{"name": "bash", "arguments": {"command": </tool_call>'


@pytest.fixture()
def scripted(tokenizer: Any) -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM(tokenizer, scripts={"good": [GOOD, "Done."], "malformed": [MALFORMED]}).start()
    yield llm
    llm.stop()


@pytest.fixture()
def endpoint(tokenizer: Any, scripted: ScriptedLLM) -> Iterator[Endpoint]:
    yield from serve(tokenizer, scripted.url, SCRIPTED_MODEL, None, max_tokens_per_turn=200)


def ask(endpoint: Endpoint, script: str) -> tuple[list[dict[str, Any]], Any]:
    messages = [{"role": "user", "content": f"List the files. [script:{script}]"}]
    llm = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=endpoint.key, max_retries=0)
    return messages, llm.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS)


def test_a_tool_call_comes_back_as_openai_tool_calls_and_the_answer_extends_the_record(
    endpoint: Endpoint, tokenizer: Any
) -> None:
    messages, reply = ask(endpoint, "good")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt"},
    ]
    llm = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=endpoint.key, max_retries=0)
    assert llm.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS).choices[0].message.content
    record = endpoint.session.record()
    assert record.segments == [], "the tool result extends the same record"
    assert record.turns[1].tool_calls[0].name == "bash" and record.counts.tool_calls == 1
    assert_exact_against_backend(record, endpoint.served)
    assert_decodes_to_conversation(record, endpoint.renderer(tokenizer), messages[:1])


def test_a_malformed_tool_call_comes_back_as_text_and_is_recorded(endpoint: Endpoint) -> None:
    _, reply = ask(endpoint, "malformed")
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert choice.message.content == MALFORMED, "the whole reply, as vLLM returns an unparsable call"
    record = endpoint.session.record()
    [turn] = [t for t in record.turns if t.role == "assistant"]
    assert turn.tool_calls[0].error and turn.tool_calls[0].raw
    assert record.counts.malformed_tool_calls == 1 and record.counts.tool_calls == 1


@pytest.mark.parametrize(("limits", "status"), [({"max_turns": 1}, 409), ({"max_context_tokens": 3330}, 400)])
def test_a_job_out_of_turns_or_context_refuses_the_call(
    tokenizer: Any, scripted: ScriptedLLM, limits: dict[str, int], status: int
) -> None:
    for endpoint in serve(tokenizer, scripted.url, SCRIPTED_MODEL, None, max_tokens_per_turn=200, **limits):
        messages, reply = ask(endpoint, "good")  # the first call fits both limits (the prompt: ~3.2k tokens)
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "More, please. " * 20},
        ]
        llm = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=endpoint.key, max_retries=0)
        with pytest.raises(openai.APIStatusError) as refused:
            llm.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS)
        assert refused.value.status_code == status
        assert len(endpoint.served) == 1, "the refused call never reached the model"
        assert endpoint.session.record().validate() is None


def test_a_call_whose_generation_fails_leaves_the_record_as_it_was(endpoint: Endpoint, scripted: ScriptedLLM) -> None:
    messages, reply = ask(endpoint, "good")
    before = endpoint.session.record().to_dict()
    scripted.stop()  # the backend goes away: the next call cannot be generated
    messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    llm = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=endpoint.key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as failed:
        llm.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS)
    assert failed.value.status_code == 502, "an infrastructure failure, said so"
    with pytest.raises(openai.APIStatusError):  # a fresh conversation fails too, and is taken back too
        llm.chat.completions.create(model=SCRIPTED_MODEL, messages=messages[:1], tools=TOOLS)
    after = endpoint.session.record().to_dict()
    assert {**after, "timings": None} == {**before, "timings": None}, "no dangling observation or segment"


def test_a_failed_call_of_one_conversation_leaves_every_conversation_as_it_was(
    endpoint: Endpoint, scripted: ScriptedLLM
) -> None:
    llm = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=endpoint.key, max_retries=0)
    asked: dict[str, list[dict[str, Any]]] = {}
    for name in ("a", "b"):
        messages = [{"role": "user", "content": f"Agent {name}: list the files. [script:good]"}]
        reply = llm.chat.completions.create(
            model=SCRIPTED_MODEL, messages=messages, tools=TOOLS, extra_headers={CONVERSATION_HEADER: name}
        )
        asked[name] = [
            *messages,
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Go on."},
        ]
    before = endpoint.session.record().to_dict()
    scripted.stop()  # the backend goes away
    for name, messages in (("a", asked["a"][:1]), ("b", asked["b"])):  # a's new segment, b's next turn
        with pytest.raises(openai.APIStatusError) as failed:
            llm.chat.completions.create(
                model=SCRIPTED_MODEL, messages=messages, tools=TOOLS, extra_headers={CONVERSATION_HEADER: name}
            )
        assert failed.value.status_code == 502
    after = endpoint.session.record().to_dict()
    assert {**after, "timings": None} == {**before, "timings": None}, "no segment closed, no observation left"
    assert [s["stop_reason"] for s in after["segments"]] == [None], "a's segment is open again"
