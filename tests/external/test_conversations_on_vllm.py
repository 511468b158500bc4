"""Several conversations in one job (sub-agents, parallel agents) in front of real vLLM: told apart by prefix or
by the `x-rollouts-conversation` header, each a chain of token-exact segments, the order of calls kept.

Every assistant turn carries its call's index across the job, and `endpoint.served` holds the backend calls in
that order, so `served[turn.call]` is the call that generated the turn: each segment is checked against exactly
its own calls.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from cli.vllm_server import VLLMServer
from shared.external_agent_tokens import CONVERSATION_HEADER
from shared.trajectory import ASSISTANT, Trajectory
from tests.external.conftest import TASK, TOOLS, Endpoint, serve
from tests.support.trajectory_checks import assert_decodes_to_conversation, assert_exact_against_backend
from tests.support.vllm_server import SERVED_NAME
from workers.rollout.external_agent import wire

NUDGE = {"role": "user", "content": "Go on."}
SUB_TASK = [{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": "Say 7."}]


@pytest.fixture()
def endpoint(tokenizer: Any, vllm_server: VLLMServer) -> Iterator[Endpoint]:
    yield from serve(tokenizer, vllm_server.url, SERVED_NAME, None, max_conversations=2)


def agent(endpoint: Endpoint) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=endpoint.key, max_retries=0)


def step(llm: openai.OpenAI, messages: list[dict[str, Any]], name: str | None = None) -> list[dict[str, Any]]:
    """One call; the messages the agent sends next (the reply it got, then a nudge)."""
    headers = {CONVERSATION_HEADER: name} if name else None
    reply = llm.chat.completions.create(model=SERVED_NAME, messages=messages, tools=TOOLS, extra_headers=headers)
    return [*messages, reply.choices[0].message.model_dump(exclude_none=True), NUDGE]


def calls(record: Trajectory) -> list[int | None]:
    return [t.call for t in record.turns if t.role == ASSISTANT]


def assert_exact(record: Trajectory, endpoint: Endpoint) -> None:
    """The segment is token-exact against the backend calls that generated its turns (by their call index)."""
    assert_exact_against_backend(record, [endpoint.served[c] for c in calls(record) if c is not None])


def finish(endpoint: Endpoint) -> None:
    answer = httpx.post(f"{endpoint.url}/finish", headers={"Authorization": f"Bearer {endpoint.key}"})
    assert answer.status_code == 200


def test_interleaved_conversations_are_told_apart_by_prefix(endpoint: Endpoint, tokenizer: Any) -> None:
    llm = agent(endpoint)
    main, sub = list(TASK), list(SUB_TASK)
    main = step(llm, main)  # call 0: a new conversation, c0
    sub = step(llm, sub)  # call 1: extends nothing, c1
    main = step(llm, main)  # call 2: extends c0 (c1 is tried first: it was called last)
    sub = step(llm, sub)  # call 3: extends c1
    step(llm, main)  # call 4: extends c0, the last call
    finish(endpoint)
    record = endpoint.session.record()
    assert record.conversation == "c0" and calls(record) == [0, 2, 4], "the last call's conversation on top"
    assert len(record.segments) == 1
    other = Trajectory.from_dict(record.segments[0])
    assert other.conversation == "c1" and calls(other) == [1, 3]
    assert record.stop_reason == other.stop_reason == "finish", "every conversation ends with the rollout"
    for segment, task in ((record, TASK), (other, SUB_TASK)):
        assert_exact(segment, endpoint)
        assert_decodes_to_conversation(segment, endpoint.renderer(tokenizer), task)
    assert Trajectory.from_dict(record.to_dict()) == record


def test_named_conversations_are_chains_of_segments_in_call_order(endpoint: Endpoint, tokenizer: Any) -> None:
    llm = agent(endpoint)
    first = step(llm, TASK, "planner")  # call 0
    worker = step(llm, TASK, "worker")  # call 1: the same messages, another conversation by its name
    step(llm, first, "planner")  # call 2
    edited = [*TASK, {"role": "assistant", "content": "A summary of the work so far."}, NUDGE]
    step(llm, edited, "planner")  # call 3: does not extend "planner": its new segment
    step(llm, worker, "worker")  # call 4
    record = endpoint.session.record()
    chain = [Trajectory.from_dict(s) for s in record.segments]
    assert [(s.conversation, calls(s)) for s in chain] == [("planner", [0, 2]), ("planner", [3])]
    assert (record.conversation, calls(record)) == ("worker", [1, 4])
    assert chain[0].stop_reason == "new_segment" and chain[1].stop_reason is None, "still open"
    for segment in (*chain, record):
        assert_exact(segment, endpoint)
    assert_decodes_to_conversation(chain[1], endpoint.renderer(tokenizer), edited)


def test_an_unnamed_call_that_extends_no_conversation_starts_a_new_one(endpoint: Endpoint) -> None:
    llm = agent(endpoint)
    step(llm, TASK)
    step(llm, [*TASK, {"role": "assistant", "content": "I edited what the model said."}, NUDGE])
    record = endpoint.session.record()
    earlier = Trajectory.from_dict(record.segments[0])
    assert (earlier.conversation, record.conversation) == ("c0", "c1")
    assert earlier.stop_reason is None, "not closed: a new conversation, the first may still go on"


def test_parallel_calls_of_two_conversations_keep_each_record_exact(endpoint: Endpoint, tokenizer: Any) -> None:
    """Two agents calling the session from their own threads at once: each conversation stays one exact record."""
    session, failures = endpoint.session, []

    def run(task: list[dict[str, Any]]) -> None:
        messages = list(task)
        try:
            for _ in range(3):
                call = wire.ChatRequest.model_validate({"model": SERVED_NAME, "messages": messages, "tools": TOOLS})
                answer = session.chat(call)
                messages = [*messages, answer["choices"][0]["message"], NUDGE]
        except Exception as exc:  # noqa: BLE001 - reported by the test's own assert
            failures.append(exc)

    agents = [threading.Thread(target=run, args=(task,)) for task in (TASK, SUB_TASK)]
    for thread in agents:
        thread.start()
    for thread in agents:
        thread.join()
    assert failures == []
    record = session.record()
    segments = [record, *(Trajectory.from_dict(s) for s in record.segments)]
    assert sorted(s.conversation or "" for s in segments) == ["c0", "c1"], "two conversations, one segment each"
    assert sorted(c for s in segments for c in calls(s)) == list(range(6)), "each call indexed once"
    for segment in segments:
        assert len(calls(segment)) == 3 and calls(segment) == sorted(calls(segment))
        assert_exact(segment, endpoint)
        task = TASK if segment.turns[0].text.find("2 + 3") >= 0 else SUB_TASK
        assert_decodes_to_conversation(segment, endpoint.renderer(tokenizer), task)


def test_a_call_beyond_the_conversation_limit_is_refused_and_leaves_the_record_as_it_was(endpoint: Endpoint) -> None:
    llm = agent(endpoint)
    main = step(llm, TASK)
    step(llm, SUB_TASK)  # the job's limit: two conversations
    before = endpoint.session.record().to_dict()
    with pytest.raises(openai.APIStatusError) as refused:
        step(llm, [{"role": "user", "content": "A third agent."}])
    assert refused.value.status_code == 409
    assert "external_agent_max_conversations" in refused.value.response.json()["error"]["message"]
    with pytest.raises(openai.APIStatusError) as named:
        step(llm, TASK, "third")
    assert named.value.status_code == 409
    after = endpoint.session.record().to_dict()
    assert {**after, "timings": None} == {**before, "timings": None}, "no segment without its generation"
    step(llm, main)  # an open conversation goes on
    step(llm, SUB_TASK, "c1")  # and a named one may start a new segment
    record = endpoint.session.record()
    assert [Trajectory.from_dict(s).conversation for s in record.segments] == ["c0", "c1"]
    assert record.conversation == "c1" and len(endpoint.served) == 4
    assert all(s["segments"] == [] for s in record.to_dict()["segments"]), "the record read mid-run left nothing"


def test_a_malformed_conversation_id_is_refused_naming_the_header(endpoint: Endpoint) -> None:
    for name in ("", "a b", "x" * 129, "tab\there"):
        answer = httpx.post(
            f"{endpoint.url}/v1/chat/completions",
            json={"model": SERVED_NAME, "messages": TASK},
            headers={"Authorization": f"Bearer {endpoint.key}", CONVERSATION_HEADER: name},
        )
        assert answer.status_code == 400, name
        assert answer.json()["error"]["param"] == CONVERSATION_HEADER
    assert endpoint.served == []
