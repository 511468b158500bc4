"""Checks every agent-loop test applies to a finished record: exact against the backend, exact against the template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.trajectory import ASSISTANT, OBSERVATION, Trajectory
from workers.rollout.chat_delta import ChatRenderer


@dataclass
class Served:
    """One backend call as the backend saw and answered it."""

    prompt: list[int]
    token_ids: list[int]
    logprobs: list[float]
    max_tokens: int
    backend_id: str = ""


def assert_exact_against_backend(record: Trajectory, served: list[Served]) -> None:
    """Token by token: each generated span is what its call returned, each call saw exactly the record before it."""
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
