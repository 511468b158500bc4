"""Each vocabulary is written once: the Lua scripts and the client use the words of the service's enums
(JobStatus, AttemptResult, BatchStatus) and record field names (shared/jobs/record_fields.py). The Lua
and the client cannot import them, so this test reads them and compares."""

from __future__ import annotations

import re
from pathlib import Path

import rollouts_client
from shared.batches.staleness import STALE
from shared.batches.status import BatchStatus
from shared.jobs import record_fields
from shared.jobs.status import TERMINAL, AttemptResult, JobStatus

ROOT = Path(__file__).resolve().parents[1]


def _lua(path: str) -> str:
    return (ROOT / path).read_text()


def test_the_client_has_the_services_statuses() -> None:
    assert [(s.name, s.value) for s in rollouts_client.JobStatus] == [(s.name, s.value) for s in JobStatus]
    assert [(s.name, s.value) for s in rollouts_client.BatchStatus] == [(s.name, s.value) for s in BatchStatus]
    assert rollouts_client.TERMINAL_STATUSES == TERMINAL


def test_the_batch_scripts_speak_batch_and_job_statuses() -> None:
    batch_words, sample_words = set(), set()
    for name in ("reserve.lua", "fill.lua", "record.lua", "close.lua"):
        source = _lua(f"shared/batches/{name}")
        batch_words |= set(re.findall(r"\bstatus'?\)? ~= '(\w+)'", source))
        batch_words |= set(re.findall(r"finish\(batch, stream, '(\w+)'", source))
        sample_words |= set(re.findall(r"sample_status [~=]= '(\w+)'", source))
    assert batch_words == {BatchStatus.RUNNING, BatchStatus.COMPLETED, BatchStatus.EXHAUSTED}
    assert sample_words == {JobStatus.DONE, STALE}  # a finished job's status, or stale (shared/batches/staleness.py)


def test_a_refused_move_says_superseded_as_the_runner_does() -> None:
    refusals = re.findall(r"return \{0, '(\w+)'\}", _lua("shared/jobs/transition.lua"))
    assert refusals == [AttemptResult.SUPERSEDED]


def test_take_builds_the_record_fields_as_record_fields_does() -> None:
    source = _lua("shared/jobs/take.lua")
    built = {f"{head}STAGE{tail}" for head, tail in re.findall(r"'(\w+:)' \.\. stage(?: \.\. '(:\w+)')?", source)}
    assert built == {
        record_fields.time_field("STAGE", "started"),
        record_fields.worker_field("STAGE"),
        record_fields.attempts_field("STAGE"),
    }
