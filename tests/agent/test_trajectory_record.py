"""The trajectory record's invariants, its (de)serialization, and the trainer's padded tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rollouts_client.training import collate_trajectories
from shared.codec import pack, unpack
from shared.trajectory import ASSISTANT, OBSERVATION, PROMPT, ToolCallRecord, Trajectory, TrajectoryError, Turn


def build(prompt: list[int], *turns: tuple[str, list[int]]) -> Trajectory:
    record = Trajectory()
    record.append(Turn(PROMPT, 0, 0, "p"), prompt)
    for role, ids in turns:
        if role == ASSISTANT:
            record.append(Turn(ASSISTANT, 0, 0, "a"), ids, [-0.5 - i for i in range(len(ids))])
        else:
            record.append(Turn(OBSERVATION, 0, 0, "o"), ids)
    record.stop_reason = "finish"
    return record


def test_append_tiles_the_record_and_keeps_mask_and_logprobs_aligned() -> None:
    record = build([1, 2, 3], (ASSISTANT, [4, 5]), (OBSERVATION, [6]), (ASSISTANT, [7]))
    record.validate()
    assert [(t.role, t.start, t.end) for t in record.turns] == [
        (PROMPT, 0, 3),
        (ASSISTANT, 3, 5),
        (OBSERVATION, 5, 6),
        (ASSISTANT, 6, 7),
    ]
    assert record.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    assert record.logprobs == [None, None, None, -0.5, -1.5, None, -0.5]
    assert record.prompt_length == 3
    assert (record.counts.turns, record.counts.generated_tokens, record.counts.observation_tokens) == (2, 3, 1)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda r: r.loss_mask.__setitem__(5, 1), "loss_mask[5]"),
        (lambda r: r.loss_mask.__setitem__(3, 0), "loss_mask[3]"),
        (lambda r: r.logprobs.__setitem__(4, None), "logprobs[4]"),
        (lambda r: r.logprobs.__setitem__(0, -1.0), "logprobs[0]"),
        (lambda r: setattr(r.turns[2], "start", 4), "does not follow"),
        (lambda r: r.token_ids.append(9), "lengths differ"),
        (lambda r: r.turns.pop(), "cover 6 of 7"),
        (lambda r: setattr(r, "stop_reason", "bored"), "unknown stop reason"),
    ],
)
def test_validate_rejects_a_broken_record(corrupt, message: str) -> None:
    record = build([1, 2, 3], (ASSISTANT, [4, 5]), (OBSERVATION, [6]), (ASSISTANT, [7]))
    corrupt(record)
    with pytest.raises(TrajectoryError, match=message.replace("[", r"\[").replace("]", r"\]")):
        record.validate()


def test_an_assistant_turn_needs_one_logprob_per_token() -> None:
    record = build([1])
    with pytest.raises(TrajectoryError):
        record.append(Turn(ASSISTANT, 0, 0, "a"), [2, 3], [-1.0])
    with pytest.raises(TrajectoryError):
        record.append(Turn(OBSERVATION, 0, 0, "o"), [2], [-1.0])


def test_the_record_round_trips_through_msgpack_and_json() -> None:
    record = build([1, 2], (ASSISTANT, [3, 4]), (OBSERVATION, [5, 6]), (ASSISTANT, [7]))
    tool_call = ToolCallRecord(name="bash", arguments={"command": "ls"}, raw="<tool_call>", output="a.txt")
    record.turns[1].tool_calls.append(tool_call)
    record.answer, record.final_text, record.extra = "42", "done", {"diff": "x"}
    for data in (unpack(pack(record.to_dict())), json.loads(json.dumps(record.to_dict()))):
        again = Trajectory.from_dict(data)
        assert again == record
        assert again.turns[1].tool_calls[0].arguments == {"command": "ls"}


def test_collate_pads_without_touching_the_tokens() -> None:
    short = build([1, 2], (ASSISTANT, [3]))
    long = build([1, 2, 3], (ASSISTANT, [4, 5]), (OBSERVATION, [6]), (ASSISTANT, [7]))
    batch = collate_trajectories([short.to_dict(), long], pad_token_id=99)
    assert isinstance(batch["input_ids"], torch.Tensor)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 99, 99, 99, 99], [1, 2, 3, 4, 5, 6, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0], [1] * 7]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 0, 1]]
    assert batch["old_logprobs"].tolist() == [[0, 0, -0.5, 0, 0, 0, 0], [0, 0, 0, -0.5, -1.5, 0, -0.5]]
    assert batch["lengths"].tolist() == [3, 7] and batch["prompt_lengths"].tolist() == [2, 3]


def test_collate_left_padding_numpy_and_length_cap() -> None:
    records = [build([1], (ASSISTANT, [2])), build([1, 2], (ASSISTANT, [3, 4]))]
    batch = collate_trajectories(records, pad_token_id=0, padding_side="left", max_length=5, tensors="numpy")
    assert isinstance(batch["input_ids"], np.ndarray)
    assert batch["input_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert batch["loss_mask"].tolist() == [[0, 0, 0, 0, 1], [0, 0, 0, 1, 1]]
    assert batch["old_logprobs"].dtype == np.float32
    with pytest.raises(ValueError, match="max_length=3"):
        collate_trajectories(records, max_length=3)
