"""One job's OpenAI-compatible endpoint in front of real vLLM: token-exact records, segments, streaming, refusals.

The agent side is the official `openai` package (and plain httpx where the wire itself is checked);
the model is the session's real vLLM server on the tiny model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from cli.vllm_server import VLLMServer
from shared.external_agent_tokens import CONVERSATION_HEADER, job_token
from shared.trajectory import ASSISTANT, Trajectory
from tests.external.conftest import SECRET, TASK, TOOLS, Endpoint, serve
from tests.support.trajectory_checks import assert_decodes_to_conversation, assert_exact_against_backend
from tests.support.vllm_server import SERVED_NAME
from workers.sandbox import Sandbox

NUDGE = {"role": "user", "content": "Go on."}


@pytest.fixture()
def endpoint(tokenizer: Any, vllm_server: VLLMServer, job_sandbox: Sandbox) -> Iterator[Endpoint]:
    yield from serve(tokenizer, vllm_server.url, SERVED_NAME, job_sandbox)


def agent(endpoint: Endpoint, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=key or endpoint.key, max_retries=0)


def test_calls_that_extend_the_conversation_build_one_token_exact_record(endpoint: Endpoint, tokenizer: Any) -> None:
    llm = agent(endpoint)
    messages: list[dict[str, Any]] = list(TASK)
    for _ in range(3):
        reply = llm.chat.completions.create(model=SERVED_NAME, messages=messages, tools=TOOLS)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), NUDGE]
    httpx.post(f"{endpoint.url}/finish", json={"answer": "5"}, headers={"Authorization": f"Bearer {endpoint.key}"})
    record = endpoint.session.record()
    assert record.segments == [] and record.stop_reason == "finish" and record.answer == "5"
    assert record.conversation == "c0" and [t.call for t in record.turns if t.role == ASSISTANT] == [0, 1, 2]
    assert [t.role for t in record.turns] == [
        "prompt",
        "assistant",
        "observation",
        "assistant",
        "observation",
        "assistant",
    ]
    assert_exact_against_backend(record, endpoint.served)  # the built-in loop's check, token by token
    assert_decodes_to_conversation(record, endpoint.renderer(tokenizer), TASK)
    assert all(t.model == SERVED_NAME and t.policy_version for t in record.turns if t.role == ASSISTANT)
    assert Trajectory.from_dict(record.to_dict()) == record


def test_a_call_that_does_not_extend_its_named_conversation_starts_a_new_segment(
    endpoint: Endpoint, tokenizer: Any
) -> None:
    llm, named = agent(endpoint), {CONVERSATION_HEADER: "main"}  # a harness that compacts its history names it
    first = llm.chat.completions.create(model=SERVED_NAME, messages=TASK, tools=TOOLS, extra_headers=named)
    edited = [*TASK, {"role": "assistant", "content": "I edited what the model said."}, NUDGE]
    llm.chat.completions.create(model=SERVED_NAME, messages=edited, tools=TOOLS, extra_headers=named)
    record = endpoint.session.record()
    assert len(record.segments) == 1, "the edited history cannot extend the record: a new segment"
    earlier = Trajectory.from_dict(record.segments[0])
    assert earlier.stop_reason == "new_segment"
    assert earlier.conversation == record.conversation == "main", "one conversation, a chain of two segments"
    assert [t.call for t in earlier.turns if t.role == ASSISTANT] == [0]
    assert [t.call for t in record.turns if t.role == ASSISTANT] == [1]
    assert earlier.final_text == (first.choices[0].message.content or "") or earlier.counts.tool_calls
    assert_exact_against_backend(earlier, endpoint.served[:1])
    assert_exact_against_backend(record, endpoint.served[1:])
    assert_decodes_to_conversation(record, endpoint.renderer(tokenizer), edited)


def test_streaming_sends_openai_chunks_ending_with_done(endpoint: Endpoint) -> None:
    body = {"model": SERVED_NAME, "messages": TASK, "stream": True}
    with httpx.stream(
        "POST",
        f"{endpoint.url}/v1/chat/completions",
        json=body,
        timeout=300,
        headers={"Authorization": f"Bearer {endpoint.key}"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    record = endpoint.session.record()
    assert text == record.final_text or chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # and the openai package reads the same stream
    stream = agent(endpoint).chat.completions.create(model=SERVED_NAME, messages=TASK, stream=True)
    assert [c.choices[0].finish_reason for c in stream][-1] in ("stop", "length", "tool_calls")


def test_text_completions_extend_the_record_when_the_prompt_grows(endpoint: Endpoint) -> None:
    llm = agent(endpoint)
    first = llm.completions.create(model=SERVED_NAME, prompt="Once upon a time", max_tokens=8)
    grown = "Once upon a time" + first.choices[0].text + " And then"
    streamed = llm.completions.create(model=SERVED_NAME, prompt=grown, max_tokens=8, stream=True)
    text = "".join(chunk.choices[0].text for chunk in streamed)
    record = endpoint.session.record()
    assert record.segments == []
    assert [t.role for t in record.turns] == ["prompt", "assistant", "observation", "assistant"]
    assert text == record.turns[-1].text
    assert_exact_against_backend(record, endpoint.served)


def test_the_tools_run_in_the_jobs_sandbox_and_are_recorded(endpoint: Endpoint) -> None:
    service = httpx.Client(base_url=endpoint.url, headers={"Authorization": f"Bearer {endpoint.key}"}, timeout=60)
    ran = service.post("/tools/bash", json={"command": "echo hello > note.txt && cat note.txt"}).json()
    assert ran["output"].strip() == "hello" and ran["exit_code"] == 0 and not ran["is_error"]
    assert "6" in service.post("/tools/python", json={"code": "print(2 * 3)"}).json()["output"]
    unknown = service.post("/tools/rm_rf", json={})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "name"
    bad = service.post("/tools/bash", json={"cmd": "ls"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "arguments"
    assert service.post("/finish", json={}).status_code == 200
    runs = endpoint.session.record().extra["tool_runs"]
    assert [r["name"] for r in runs] == ["bash", "python"]


def test_refusals_name_what_is_wrong(endpoint: Endpoint) -> None:
    other = job_token(SECRET, "another-job")
    with pytest.raises(openai.PermissionDeniedError):  # another job's token: 403
        agent(endpoint, key=other).chat.completions.create(model=SERVED_NAME, messages=TASK)
    assert httpx.post(f"{endpoint.url}/v1/chat/completions", json={}).status_code == 401
    with pytest.raises(openai.BadRequestError) as wrong_model:  # 400 naming the field
        agent(endpoint).chat.completions.create(model="gpt-4o", messages=TASK)
    assert wrong_model.value.body["param"] == "model"
    missing = httpx.post(
        f"{endpoint.url}/v1/chat/completions",
        json={"model": SERVED_NAME},
        headers={"Authorization": f"Bearer {endpoint.key}"},
    )
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
    bad_role = httpx.post(
        f"{endpoint.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {endpoint.key}"},
        json={"model": SERVED_NAME, "messages": [{"role": "robot", "content": "hi"}]},
    )
    assert bad_role.status_code == 400 and bad_role.json()["error"]["param"] == "messages[0].role"
    assert endpoint.served == [], "nothing refused reached the model"
    httpx.post(f"{endpoint.url}/finish", headers={"Authorization": f"Bearer {endpoint.key}"})
    with pytest.raises(openai.ConflictError):  # the rollout has ended: 409
        agent(endpoint).chat.completions.create(model=SERVED_NAME, messages=TASK)
    assert endpoint.session.record().stop_reason == "finish"
