"""What verl's V1 worker gets of a record, without a trainer: every segment as a split, and the step versions
that sampled it (records.split_segments, records.step_range; the loop's use of them: test_verl_agent_loop.py)."""

from __future__ import annotations

import pytest

from rollouts_client.trainers.records import SegmentedRecord, split_record, split_segments, step_range
from rollouts_client.trainers.settings import BridgeSettings
from tests.trainers.test_bridge_mapping import job, record


def versions(*names: str | None, spans: list[str] | None = None) -> list[dict]:
    turns = [{"turn": i, "policy_version": name, "weight_versions": []} for i, name in enumerate(names)]
    if spans is not None:
        turns.append(
            {"turn": len(turns), "policy_version": spans[0], "weight_versions": [{"version": v} for v in spans]}
        )
    return turns


def test_every_segment_is_a_split_oldest_first_the_evaluated_one_last():
    earlier = record(conversation="c1", token_ids=[9, 9, 9, 4, 5, 6, 7], token_rewards=[0] * 7)
    segmented = job(record(segments=[earlier], conversation="c0"), {"reward": 1.0, "token_rewards": [0.5] * 7})
    first, last = split_segments(segmented, "all")
    assert (first.conversation, last.conversation) == ("c1", "c0")
    assert first.prompt_ids == [9, 9, 9] and last.prompt_ids == [1, 2, 3]
    assert first.token_rewards == [0.0] * 4, "an earlier segment keeps its own token rewards, not the evaluation's"
    assert last.token_rewards == [0.5] * 4
    assert first.earlier_segments == last.earlier_segments == 1
    assert split_segments(segmented, "last") == [last] and split_record(segmented) == last
    assert split_segments(job(record()), "all") == [split_record(job(record()))], "no segments: the record alone"
    with pytest.raises(SegmentedRecord):
        split_segments(segmented, "raise")


def test_all_is_a_setting_that_one_sequence_per_row_refuses():
    assert BridgeSettings(on_segments="all").on_segments == "all"
    with pytest.raises(ValueError, match="several sequences per row"):
        split_record(job(record()), "all")


def test_the_step_range_reads_step_versions_from_spans_and_turns():
    assert step_range(versions("step-3", "step-4")) == (3, 4)
    assert step_range(versions("step-2", spans=["step-2", "step-5"])) == (2, 5), "a span that changed mid-turn"
    assert step_range(versions("step-7", None, "base")) == (7, 7), "what is not a step version is left out"
    assert step_range(versions("v1", None)) is None and step_range([]) is None
    assert step_range(versions("run-a-step-3", "step-03x")) is None, "exactly engines.step_version's form"
