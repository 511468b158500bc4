"""A finished job's token-exact record as NeMo Gym output items (nemo-gym 0.4.0's Responses API models).

One model call per assistant turn: its `prompt_token_ids` are every token of the segment before the turn, its
`generation_token_ids` and `generation_log_probs` the turn's own, so each call's prompt extends the previous
call's prompt and generation (observation tokens included): the rule NeMo-RL checks when it turns the items into
its message log (nemo_rl/environments/nemo_gym.py, "Non-contiguous messages found"). A turn's tool calls are
`function_call` items carrying the tokens on the last one (as NeMo Gym's verifiers agent does), each followed by
its `function_call_output`; a turn without calls is an assistant `message` carrying them. Non-tool messages of an
observation (the loop's nudge) are user messages without tokens. Nothing is re-tokenized. Segments (an external
agent that rewrote its history or held several conversations) are each their own run of calls, oldest first, the
evaluated one last: never concatenated into one sequence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from nemo_gym.openai_utils import (
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputText,
)
from pydantic import BaseModel

from rollouts_client.models import Job

END_OF_TURN = re.compile(r"(<\|[A-Za-z0-9_]+\|>|</s>)\s*$")  # a chat template's end-of-turn token, as decoded


@dataclass(frozen=True)
class Call:
    """One model call of a segment: the tokens NeMo-RL trains on."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]

    def fields(self) -> dict[str, Any]:
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "generation_token_ids": self.generation_token_ids,
            "generation_log_probs": self.generation_log_probs,
        }


def record_segments(job: Job, on_segments: str) -> list[dict[str, Any]]:
    """The record's segments to answer with, oldest first, the evaluated one (the record itself) last: every one
    ("all") or only the last ("last"); "raise" is the caller's (records.SegmentedRecord)."""
    record = job.trajectory
    if not record or "token_ids" not in record:
        raise ValueError(f"job {job.id}: done without a trajectory")
    earlier = list(record.get("segments") or [])
    return [*earlier, record] if on_segments == "all" else [record]


def segment_items(segment: dict[str, Any], segment_index: int) -> tuple[list[BaseModel], list[Call]]:
    """One segment's output items, in turn order, and its calls (one per assistant turn)."""
    tokens, logprobs = segment["token_ids"], segment["logprobs"]
    items: list[BaseModel] = []
    calls: list[Call] = []
    tool_calls_seen = 0
    for index, turn in enumerate(segment.get("turns") or []):
        role, start, end = turn.get("role"), int(turn["start"]), int(turn["end"])
        if role == "assistant":
            call = Call(
                prompt_token_ids=list(tokens[:start]),
                generation_token_ids=list(tokens[start:end]),
                generation_log_probs=[float(lp) for lp in logprobs[start:end]],
            )
            calls.append(call)
            item_id = f"s{segment_index}t{index}"
            turn_items, tool_calls_seen = assistant_items(turn, call, item_id, tool_calls_seen)
            items += turn_items
        elif role == "observation":
            items += [
                NeMoGymEasyInputMessage(role=message.get("role", "user"), content=text_of(message.get("content")))
                for message in turn.get("messages") or []
                if message.get("role") in ("user", "system", "developer")  # tool results are the calls' outputs
            ]
    return items, calls


def assistant_items(turn: dict[str, Any], call: Call, item_id: str, seen: int) -> tuple[list[BaseModel], int]:
    """An assistant turn as a message (no tool calls) or its function calls, tokens on the last item; each call
    followed by what running it returned. `seen` counts the segment's earlier tool calls (their ids: the loop's
    `call00001`, ...); the new count is returned."""
    text = visible_text(turn)
    tool_calls = turn.get("tool_calls") or []
    if not tool_calls:
        message = NeMoGymResponseOutputMessageForTraining(
            id=f"msg_{item_id}", content=[NeMoGymResponseOutputText(text=text, annotations=[])], **call.fields()
        )
        return [message], seen
    items: list[BaseModel] = []
    prose = text
    for tool_call in tool_calls:
        prose = prose.replace(str(tool_call.get("raw") or ""), "")
    if prose.strip():  # what the model wrote beside its calls; the tokens stay on the last call
        items.append(
            NeMoGymResponseOutputMessage(
                id=f"msg_{item_id}", content=[NeMoGymResponseOutputText(text=prose.strip(), annotations=[])]
            )
        )
    for k, tool_call in enumerate(tool_calls):
        seen += 1
        call_id = f"call{seen:05d}"
        fields = {
            "id": f"fc_{item_id}_{k}",
            "call_id": call_id,
            "name": str(tool_call.get("name") or "invalid"),
            "arguments": json.dumps(tool_call.get("arguments")) if tool_call.get("arguments") is not None else "",
            "status": "completed",
        }
        if k == len(tool_calls) - 1:
            items.append(NeMoGymResponseFunctionToolCallForTraining(**fields, **call.fields()))
        else:
            items.append(NeMoGymResponseFunctionToolCall(**fields))
        output = tool_call.get("output")
        if output is None and tool_call.get("error"):
            output = f"Error: {tool_call['error']}"
        if output is not None:
            items.append(NeMoGymFunctionCallOutput(call_id=call_id, output=str(output), status="completed"))
    return items, seen


def visible_text(turn: dict[str, Any]) -> str:
    """The turn's text for people (the tokens are what trains): the record decodes special tokens, so the end-of-turn
    token a generation stopped on (`<|im_end|>`, `<|eot_id|>`, `</s>`) is cut off its end."""
    text = str(turn.get("text") or "")
    if turn.get("finish_reason") == "stop":
        text = END_OF_TURN.sub("", text)
    return text


def text_of(content: Any) -> str:
    """A chat message's content as text (a list of parts is joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else json.dumps(content)


def job_items(job: Job, on_segments: str) -> tuple[list[BaseModel], list[Call]]:
    """Every answered segment's items and calls, in order."""
    items: list[BaseModel] = []
    calls: list[Call] = []
    for index, segment in enumerate(record_segments(job, on_segments)):
        more_items, more_calls = segment_items(segment, index)
        items += more_items
        calls += more_calls
    return items, calls
