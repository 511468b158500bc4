"""Codex CLI and Claude Code, unmodified, through a tool round trip: each call extends one token-exact record.

The tiny random model never calls a tool, so here the replies are scripted by the suite's test
double of a vLLM backend (tests/support/scripted_llm.py): the CLI is asked to run `ls` with its
own shell tool, runs it on this machine as it would for a user, sends the result back, and ends
its run on the scripted final answer. The same CLIs against real vLLM through the whole stack are
in test_harnesses_on_stack.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.trajectory import ASSISTANT, OBSERVATION, Trajectory
from tests.external.conftest import Endpoint, serve
from tests.external.harnesses import run_claude_code, run_codex
from tests.support.scripted_llm import SCRIPTED_MODEL, ScriptedLLM
from tests.support.trajectory_checks import assert_calls_exact_against_backend, recorded_calls
from tests.support.vllm_server import LONG_CONTEXT


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


SCRIPTS = {
    "claude": [tool_call("Bash", {"command": "ls", "description": "List files"}), "Done."],
    "codex": [tool_call("exec_command", {"cmd": "ls"}), "Done."],
}


@pytest.fixture()
def endpoint(tokenizer: Any) -> Iterator[Endpoint]:
    llm = ScriptedLLM(tokenizer, scripts=SCRIPTS).start()
    yield from serve(tokenizer, llm.url, SCRIPTED_MODEL, None, max_tokens_per_turn=200, max_context_tokens=LONG_CONTEXT)
    llm.stop()


def assert_round_trip_in_one_segment(endpoint: Endpoint) -> Trajectory:
    """Every call the CLI made is in the record, token-exact; the call that answered extended the one that asked
    for the tool, its result between them: one segment holds the round trip (whatever side calls the CLI made)."""
    record = endpoint.session.record()
    assert_calls_exact_against_backend(record, endpoint.served)
    segment, _ = max(recorded_calls(record), key=lambda call: call[1].call or 0)
    assert segment.final_text == "Done." and segment.counts.tool_calls == 1, "the answer after the tool's result"
    assert [t.role for t in segment.turns[-3:]] == [ASSISTANT, OBSERVATION, ASSISTANT]
    return segment


def test_claude_code_runs_its_bash_tool_and_its_calls_are_one_record(endpoint: Endpoint, tmp_path: Path) -> None:
    (tmp_path / "marker.txt").write_text("here")
    result = run_claude_code(
        endpoint.url, endpoint.key, SCRIPTED_MODEL, "List the files. [script:claude]", tmp_path, 4, ("Bash(ls)",)
    )
    assert result["is_error"] is False and result["result"] == "Done.", result
    observation = assert_round_trip_in_one_segment(endpoint).turns[-2]
    assert "marker.txt" in json.dumps(observation.messages), "the listing its own Bash tool made"


def test_codex_runs_its_exec_command_and_its_calls_are_one_record(endpoint: Endpoint, tmp_path: Path) -> None:
    (tmp_path / "marker.txt").write_text("here")
    prompt = "List the files. [script:codex]"
    events = run_codex(endpoint.url, endpoint.key, SCRIPTED_MODEL, prompt, tmp_path, "danger-full-access")
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "turn.completed", kinds
    said = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert said[-1:] == ["Done."], events
    observation = assert_round_trip_in_one_segment(endpoint).turns[-2]
    assert "marker.txt" in json.dumps(observation.messages), json.dumps(observation.messages)
