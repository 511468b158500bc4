"""Checks every agent-loop test applies to a finished record: exact against the backend, exact against the template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.trajectory import ASSISTANT, OBSERVATION, Trajectory, Turn
from workers.rollout.chat_delta import ChatRenderer


@dataclass
class Served:
    """One backend call as the backend saw and answered it."""

    prompt: list[int]
    token_ids: list[int]
    logprobs: list[float]
    max_tokens: int
    backend_id: str = ""


def segments_of(record: Trajectory) -> list[Trajectory]:
    """A record's segments, oldest first, the record itself last; each validated on its own."""
    return [Trajectory.from_dict(s) for s in record.segments] + [record]


def recorded_calls(record: Trajectory) -> list[tuple[Trajectory, Turn]]:
    """Every model call the record holds, across segments and conversations, in the order the calls were made:
    (its segment, its assistant turn). External agents' turns carry their call index: none may be missing."""
    return calls_of(segments_of(record))


def calls_of(segments: list[Trajectory]) -> list[tuple[Trajectory, Turn]]:
    """recorded_calls over segments already read (segments_of)."""
    calls = [(segment, turn) for segment in segments for turn in segment.turns if turn.role == ASSISTANT]
    if any(turn.call is not None for _, turn in calls):
        calls.sort(key=lambda call: call[1].call if call[1].call is not None else -1)
        assert [turn.call for _, turn in calls] == list(range(len(calls))), "a call is missing from the record"
    return calls


def assert_exact_against_backend(record: Trajectory, served: list[Served]) -> None:
    """Token by token: each generated span is what its call returned, each call saw exactly the record before it.
    One segment: `served` are the calls that generated its assistant turns, in order."""
    record.validate()
    turns = [t for t in record.turns if t.role == ASSISTANT]
    assert len(turns) == len(served), (len(turns), len(served))
    for k, (turn, call) in enumerate(zip(turns, served, strict=True)):
        assert call.prompt == record.token_ids[: turn.start], f"turn {k}: the backend saw a different prefix"
        assert record.token_ids[turn.start : turn.end] == call.token_ids, f"turn {k}: tokens drifted"
        assert record.logprobs[turn.start : turn.end] == call.logprobs, f"turn {k}: logprobs drifted"
        assert len(call.token_ids) <= call.max_tokens, f"turn {k}: more tokens than asked"
    generated = {i for t in turns for i in range(t.start, t.end)}
    masked = [i for i, m in enumerate(record.loss_mask) if m]
    assert masked == sorted(generated), "loss mask is not exactly the generated tokens"
    assert sum(t.end - t.start for t in record.turns) == len(record.token_ids)
    assert record.counts.generated_tokens == len(generated)


def assert_calls_exact_against_backend(record: Trajectory, served: list[Served]) -> None:
    """Every call a job's endpoint served (`served`, in call order) is in the record, in whichever segment or
    conversation the calls made, and each segment is token-exact against its own calls."""
    segments = segments_of(record)
    calls = calls_of(segments)
    assert len(calls) == len(served), f"{len(calls)} calls recorded, {len(served)} served"
    position = {id(turn): k for k, (_, turn) in enumerate(calls)}
    for segment in segments:
        own = [served[position[id(t)]] for t in segment.turns if t.role == ASSISTANT]
        assert_exact_against_backend(segment, own)


def assert_every_conversation_ended(record: Trajectory, stop_reason: str = "finish") -> None:
    """Each conversation's last segment ended with the rollout (`stop_reason`), its earlier ones as new segments."""
    last: dict[str | None, Trajectory] = {}
    for segment in segments_of(record):
        if segment.conversation in last:
            assert last[segment.conversation].stop_reason == "new_segment", segment.conversation
        last[segment.conversation] = segment
    assert {c: s.stop_reason for c, s in last.items()} == dict.fromkeys(last, stop_reason)


def tokens_billed(record: Trajectory) -> int:
    """What the calls' usage adds up to: each call's prompt (its segment before it) plus the tokens it generated."""
    return sum(turn.end for _, turn in recorded_calls(record))


def assert_decodes_to_conversation(
    record: Trajectory, renderer: ChatRenderer, task_messages: list[dict[str, Any]]
) -> None:
    """decode(token_ids) is the conversation the chat template renders from scratch, turn by turn."""
    messages = renderer.prepare(task_messages)
    for turn in record.turns[1:]:
        if turn.role == ASSISTANT:
            expected = renderer.render(messages, add_generation_prompt=True)
            assert renderer.decode(record.token_ids[: turn.start]) == expected
            ids = record.token_ids[turn.start : turn.end]
            ends_on_token = turn.finish_reason == "stop" and bool(ids) and ids[-1] in renderer.tokenizer.all_special_ids
            content, _ = renderer.split_generation(ids, ends_on_token)
            messages.append({"role": "assistant", "content": content})
        elif turn.role == OBSERVATION:
            messages.extend(turn.messages)
    last = record.turns[-1]
    if last.role != ASSISTANT:  # the prompt alone, or an observation
        assert renderer.decode(record.token_ids) == renderer.render(messages, add_generation_prompt=True)
    else:
        opened = renderer.render(messages[:-1], add_generation_prompt=True)
        assert renderer.decode(record.token_ids) == opened + last.text
