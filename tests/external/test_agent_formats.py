"""The Responses and Anthropic Messages routes of a job's endpoint, driven by the unmodified `openai` and `anthropic`
SDKs: tool-call round trips that extend one token-exact record, both SSE event sequences, and each format's refusals.

The tiny random model almost never writes a tool call, so the replies here are scripted by the
suite's test double of a vLLM backend (tests/support/scripted_llm.py); the same SDKs against real
vLLM are in test_agent_formats_on_vllm.py.
"""

from __future__ import annotations

import json
import os
import string
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.external.conftest import TOOLS, Endpoint, renderer_for, serve
from tests.support.scripted_llm import SCRIPTED_MODEL, ScriptedLLM
from tests.support.trajectory_checks import (
    assert_calls_exact_against_backend,
    assert_decodes_to_conversation,
    assert_exact_against_backend,
    recorded_calls,
)
from workers.rollout.external_agent import anthropic_api, responses_api

GOOD = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
SYSTEM = "You are a careful assistant."
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "parameters": t["function"]["parameters"],
        "strict": False,
    }
    for t in TOOLS
]


@pytest.fixture()
def scripted(tokenizer: Any) -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM(tokenizer, scripts={"tool": [GOOD, "Done."], "hi": ["Hello there."]}).start()
    yield llm
    llm.stop()


@pytest.fixture()
def endpoint(tokenizer: Any, scripted: ScriptedLLM) -> Iterator[Endpoint]:
    yield from serve(tokenizer, scripted.url, SCRIPTED_MODEL, None, max_tokens_per_turn=200)


def claude(endpoint: Endpoint, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=endpoint.url, api_key=key or endpoint.key, max_retries=0)


def responses(endpoint: Endpoint, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=key or endpoint.key, max_retries=0)


def task_messages(script: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"List the files. [script:{script}]"}]


def assert_one_exact_record(
    endpoint: Endpoint, tokenizer: Any, chat_tools: list[dict[str, Any]] | None, script: str, turns: int
) -> None:
    record = endpoint.session.record()
    assert record.segments == [], "every call extended the same record"
    assert record.counts.turns == turns
    assert_exact_against_backend(record, endpoint.served)
    assert_decodes_to_conversation(record, renderer_for(tokenizer, chat_tools), task_messages(script))


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_tool_use_loop_extends_one_token_exact_record(
    endpoint: Endpoint, tokenizer: Any, stream: bool
) -> None:
    llm = claude(endpoint)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the files. [script:tool]"}]
    stops, asked = [], []
    for _ in range(4):  # the harness's loop: run the tools it is asked for until the model ends its turn
        kwargs = {
            "model": SCRIPTED_MODEL,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
            "max_tokens": 100,
        }
        if stream:
            with llm.messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = llm.messages.create(**kwargs)
        stops.append(reply.stop_reason)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        calls = [block for block in reply.content if block.type == "tool_use"]
        asked += calls
        if reply.stop_reason != "tool_use":
            break
        assert [(c.name, c.input) for c in calls] == [("bash", {"command": "ls"})]
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": c.id, "content": "a.txt"} for c in calls],
            }
        )
    assert stops == ["tool_use", "end_turn"]
    assert reply.content[0].text == "Done." and reply.usage.output_tokens > 0
    assert_one_exact_record(endpoint, tokenizer, anthropic_api.chat_tools(ANTHROPIC_TOOLS), "tool", turns=2)
    assert endpoint.session.record().turns[2].messages == [
        {"role": "tool", "content": "a.txt", "tool_call_id": asked[0].id}
    ]


def test_a_responses_function_call_loop_extends_one_token_exact_record(endpoint: Endpoint, tokenizer: Any) -> None:
    llm = responses(endpoint)
    items: list[Any] = [{"role": "user", "content": "List the files. [script:tool]"}]
    first = llm.responses.create(model=SCRIPTED_MODEL, instructions=SYSTEM, input=items, tools=RESPONSES_TOOLS)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and call.name == "bash" and json.loads(call.arguments) == {"command": "ls"}
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"})
    second = llm.responses.create(model=SCRIPTED_MODEL, instructions=SYSTEM, input=items, tools=RESPONSES_TOOLS)
    assert second.output_text == "Done." and second.usage.output_tokens > 0
    assert_one_exact_record(endpoint, tokenizer, responses_api.chat_tools(RESPONSES_TOOLS), "tool", turns=2)


def test_previous_response_id_continues_the_stored_conversation(endpoint: Endpoint, tokenizer: Any) -> None:
    llm = responses(endpoint)
    first = llm.responses.create(
        model=SCRIPTED_MODEL, instructions=SYSTEM, tools=RESPONSES_TOOLS, input="List the files. [script:tool]"
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    second = llm.responses.create(
        model=SCRIPTED_MODEL,
        instructions=SYSTEM,
        tools=RESPONSES_TOOLS,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}],
    )
    assert second.output_text == "Done." and second.previous_response_id == first.id
    assert_one_exact_record(endpoint, tokenizer, responses_api.chat_tools(RESPONSES_TOOLS), "tool", turns=2)
    unstored = llm.responses.create(model=SCRIPTED_MODEL, input="[script:hi]", store=False)
    with pytest.raises(openai.BadRequestError) as gone:  # store: false is honoured: nothing to continue
        llm.responses.create(model=SCRIPTED_MODEL, input="Go on.", previous_response_id=unstored.id)
    assert gone.value.body["param"] == "previous_response_id"


def test_responses_streaming_is_the_responses_event_sequence(endpoint: Endpoint) -> None:
    llm = responses(endpoint)
    events = list(
        llm.responses.create(model=SCRIPTED_MODEL, input="Say hi. [script:tool]", tools=RESPONSES_TOOLS, stream=True)
    )
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    call = events[-1].response.output[0]
    assert call.type == "function_call" and json.loads(call.arguments) == {"command": "ls"}
    items = [
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"},
    ]
    asked = [{"role": "user", "content": "Say hi. [script:tool]"}, *items]
    with llm.responses.stream(model=SCRIPTED_MODEL, input=asked, tools=RESPONSES_TOOLS) as stream:
        text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text == "Done."
    assert endpoint.session.record().segments == []


def test_a_system_message_among_the_messages_stays_a_system_message(endpoint: Endpoint, tokenizer: Any) -> None:
    """Claude Code sends its environment as a system message after the first user message."""
    environment = [{"type": "text", "text": "# Environment\n - Platform: linux\n"}]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "List the files. [script:hi]"}]},
        {"role": "system", "content": environment},
    ]
    reply = claude(endpoint).messages.create(
        model=SCRIPTED_MODEL, system=SYSTEM, messages=messages, tools=ANTHROPIC_TOOLS, max_tokens=100
    )
    assert reply.content[0].text == "Hello there." and reply.stop_reason == "end_turn"
    task = [*task_messages("hi"), {"role": "system", "content": environment[0]["text"]}]
    record = endpoint.session.record()
    assert_exact_against_backend(record, endpoint.served)
    assert_decodes_to_conversation(record, renderer_for(tokenizer, anthropic_api.chat_tools(ANTHROPIC_TOOLS)), task)


def test_a_reply_cut_at_max_tokens_says_so_in_each_format(endpoint: Endpoint) -> None:
    cut = claude(endpoint).messages.create(
        model=SCRIPTED_MODEL, max_tokens=2, messages=[{"role": "user", "content": "[script:hi]"}]
    )
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    incomplete = responses(endpoint).responses.create(model=SCRIPTED_MODEL, input="[script:hi]", max_output_tokens=2)
    assert incomplete.status == "incomplete" and incomplete.incomplete_details.reason == "max_output_tokens"
    assert [call.max_tokens for call in endpoint.served] == [2, 2]


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason", "expected"),
    [
        ("stop", "END", ("stop_sequence", "END")),  # one of the request's stop_sequences
        ("stop", "<|im_end|>", ("end_turn", None)),  # the job's own stop string is not the agent's
        ("stop", None, ("end_turn", None)),
        ("length", None, ("max_tokens", None)),
    ],
)
def test_a_messages_stop_reason_names_the_agents_stop_sequence(
    finish_reason: str, stop_reason: str | None, expected: tuple[str, str | None]
) -> None:
    request = anthropic_api.MessagesRequest(
        model="m", max_tokens=8, stop_sequences=["END"], messages=[{"role": "user", "content": "hi"}]
    )
    chat = {
        "id": "chatcmpl-1",
        "model": "m",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        "choices": [
            {
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
        ],
    }
    message = anthropic_api.message_of(chat, request)
    assert (message["stop_reason"], message["stop_sequence"]) == expected


def test_anthropic_refusals_are_anthropic_errors_naming_the_field(endpoint: Endpoint) -> None:
    hi = [{"role": "user", "content": "[script:hi]"}]
    with pytest.raises(anthropic.PermissionDeniedError):  # another job's token
        claude(endpoint, key="not-this-jobs-key").messages.create(model=SCRIPTED_MODEL, max_tokens=8, messages=hi)
    with pytest.raises(anthropic.BadRequestError) as wrong_model:
        claude(endpoint).messages.create(model="not-the-jobs-model", max_tokens=8, messages=hi)
    assert wrong_model.value.body["error"]["message"].startswith("model: ")
    url, key = f"{endpoint.url}/v1/messages", {"x-api-key": endpoint.key}
    no_key = httpx.post(url, json={"model": SCRIPTED_MODEL, "max_tokens": 8, "messages": hi})
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    for body, field in [
        ({"model": SCRIPTED_MODEL, "messages": hi}, "max_tokens"),
        (
            {"model": SCRIPTED_MODEL, "max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]},
            "messages.0.role",
        ),
        (
            {
                "model": SCRIPTED_MODEL,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            },
            "messages.0.content.0.type",
        ),
        (
            {
                "model": SCRIPTED_MODEL,
                "max_tokens": 8,
                "messages": [*hi, {"role": "system", "content": [{"type": "image", "source": {}}]}],
            },
            "messages.1.content.0",
        ),
        (
            {
                "model": SCRIPTED_MODEL,
                "max_tokens": 8,
                "messages": hi,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools.0",
        ),
    ]:
        refused = httpx.post(url, json=body, headers=key)
        assert refused.status_code == 400, refused.text
        assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "invalid_request_error"
        assert refused.json()["error"]["message"].startswith(f"{field}: "), refused.json()
    assert endpoint.served == [], "nothing refused reached the model"
    httpx.post(f"{endpoint.url}/finish", headers=key)
    with pytest.raises(anthropic.ConflictError):  # the rollout has ended: 409
        claude(endpoint).messages.create(model=SCRIPTED_MODEL, max_tokens=8, messages=hi)


def test_responses_refusals_are_openai_errors_naming_the_field(endpoint: Endpoint) -> None:
    with pytest.raises(openai.PermissionDeniedError):
        responses(endpoint, key="not-this-jobs-key").responses.create(model=SCRIPTED_MODEL, input="[script:hi]")
    url, key = f"{endpoint.url}/v1/responses", {"Authorization": f"Bearer {endpoint.key}"}
    assert httpx.post(url, json={"model": SCRIPTED_MODEL, "input": "hi"}).status_code == 401
    for body, field in [
        ({"model": "gpt-5", "input": "hi"}, "model"),
        ({"model": SCRIPTED_MODEL}, "input"),
        ({"model": SCRIPTED_MODEL, "input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"model": SCRIPTED_MODEL, "input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"model": SCRIPTED_MODEL, "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"model": SCRIPTED_MODEL, "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": SCRIPTED_MODEL, "input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"model": SCRIPTED_MODEL, "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ]:
        refused = httpx.post(url, json=body, headers=key)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == field, refused.json()
    assert endpoint.served == [], "nothing refused reached the model"
    httpx.post(f"{endpoint.url}/finish", headers=key)
    with pytest.raises(openai.ConflictError):  # the rollout has ended: 409
        responses(endpoint).responses.create(model=SCRIPTED_MODEL, input="[script:hi]")


AGENTS_ENV = Path(os.environ.get("ROLLOUTS_AGENTS_SDK_ENV", Path.home() / ".cache/rollouts/openai-agents"))
AGENTS_PYTHON = AGENTS_ENV / "bin/python"
HARNESS = Path(__file__).with_name("openai_agents_harness.py")


def common_token_ids(tokenizer: Any) -> list[int]:
    """64 token ids (letters, digits, space, '.') to stop on: the tiny random model's turns then end (`completed`)
    instead of being cut at the token limit, which the Agents SDK takes as a failed run (as it takes OpenAI's own
    `incomplete`)."""
    ids = {tokenizer.encode(c, add_special_tokens=False)[-1] for c in string.ascii_letters + string.digits + " ."}
    return sorted(ids)[:64]


def run_openai_agents(endpoint: Endpoint, model: str, prompt: str, stream: bool = False) -> dict[str, Any]:
    return run_openai_agents_at(endpoint.url, endpoint.key, model, prompt, stream)


def run_openai_agents_at(base_url: str, key: str, model: str, prompt: str, stream: bool = False) -> dict[str, Any]:
    """The OpenAI Agents SDK harness, run to its end by the SDK's own environment (scripts/setup.sh test)."""
    assert AGENTS_PYTHON.exists(), f"no OpenAI Agents SDK environment at {AGENTS_ENV}: run scripts/setup.sh test"
    command = [str(AGENTS_PYTHON), str(HARNESS), base_url, key, model, prompt, *(["--stream"] * stream)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_agents_sdk_runs_its_function_tool_loop_to_its_end(
    endpoint: Endpoint, tokenizer: Any, stream: bool
) -> None:
    ran = run_openai_agents(endpoint, SCRIPTED_MODEL, "List the files. [script:tool]", stream)
    assert ran["model_class"] == "OpenAIResponsesModel", "the SDK's default model class: the Responses API"
    assert ran["tool_calls"] == [{"name": "bash", "command": "ls"}] and ran["final_output"] == "Done."
    record = endpoint.session.record()
    assert_calls_exact_against_backend(record, endpoint.served)
    assert len(recorded_calls(record)) == len(ran["responses"]), "every call the SDK made"
    answered, _ = recorded_calls(record)[-1]
    assert answered.final_text == "Done." and answered.turns[2].messages[0]["role"] == "tool", (
        "the tool's output extended the record of the call that asked for it"
    )


@pytest.fixture()
def backendless(tokenizer: Any) -> Iterator[Endpoint]:
    """A job whose backend is gone: every generation fails (connection refused)."""
    from cli.embedded_redis import free_port

    yield from serve(tokenizer, f"http://127.0.0.1:{free_port()}", SCRIPTED_MODEL, None)


def test_a_backend_failure_is_each_formats_502_and_leaves_the_record_as_it_was(backendless: Endpoint) -> None:
    with pytest.raises(anthropic.InternalServerError) as failed:
        claude(backendless).messages.create(
            model=SCRIPTED_MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert failed.value.status_code == 502 and failed.value.body["error"]["type"] == "api_error"
    with pytest.raises(openai.InternalServerError) as also:
        responses(backendless).responses.create(model=SCRIPTED_MODEL, input="hi")
    assert also.value.status_code == 502 and also.value.body["type"] == "server_error"
    record = backendless.session.record()
    assert record.token_ids == [] and record.segments == [], "no prompt or segment without its generation"


def test_a_conversation_whose_prompt_is_over_max_prompt_tokens_is_refused_before_the_model(tokenizer: Any) -> None:
    from cli.embedded_redis import free_port

    for endpoint in serve(tokenizer, f"http://127.0.0.1:{free_port()}", SCRIPTED_MODEL, None, max_prompt_tokens=8):
        with pytest.raises(openai.BadRequestError) as refused:
            responses(endpoint).chat.completions.create(
                model=SCRIPTED_MODEL, messages=[{"role": "user", "content": "What is 2 + 2?"}]
            )
        assert refused.value.status_code == 400 and refused.value.body["param"] == "messages", refused.value.body
        assert "more than limits.max_prompt_tokens=8" in refused.value.body["message"]
        assert endpoint.served == [] and endpoint.session.record().token_ids == [], "nothing reached the model"
