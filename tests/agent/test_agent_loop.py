"""The agent loop against the scripted vLLM stand-in and a real sandbox: tool calls, errors, every stop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from shared.codec import pack, unpack
from shared.config import Settings
from shared.jobs.spec import JobRequest
from shared.tasks import StageContext, StageInterrupted
from shared.tool_schemas import TOOL_SCHEMAS
from shared.trajectory import OBSERVATION, Trajectory
from tests.agent.conftest import Unlimited
from tests.support.scripted_llm import ScriptedLLM
from tests.support.trajectory_checks import Served, assert_decodes_to_conversation, assert_exact_against_backend
from workers.rollout.agent_loop import AgentLoop, LoopConfig, PromptTooLong
from workers.rollout.chat_delta import ChatRenderer, tool_instructions_json
from workers.rollout.llm_client import LLMClient
from workers.rollout.llm_completion import Sampling
from workers.rollout.tool_parsers import get_parser
from workers.sandbox import Sandbox
from workers.toolserver.result import ToolResult

TOOL_NAMES = ("bash", "finish")


def call(name: str, **arguments: Any) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def task(script: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": f"Do it. [script:{script}]"},
    ]


class Harness:
    """One loop wired to the scripted server (over real HTTP) and a tool runner."""

    def __init__(
        self, llm: ScriptedLLM, tokenizer: Any, run_tool: Any, parser: str = "hermes", budget: Any = None, **config: Any
    ) -> None:
        self.llm = llm
        tools = [s for s in TOOL_SCHEMAS if s["function"]["name"] in TOOL_NAMES]
        self.parser = get_parser(parser)
        self.renderer = ChatRenderer(tokenizer, tools, tool_instructions_json(tools, self.parser.call_format))
        self.client = LLMClient(request_timeout_s=30, max_retries=0)
        defaults = {"max_turns": 8, "max_context_tokens": 4000, "max_tokens_per_turn": 400, "allowed_tools": TOOL_NAMES}
        self.config = LoopConfig(**{**defaults, **config})
        self.loop = AgentLoop(
            self.renderer,
            self.parser,
            lambda ids, s: self.client.complete(llm.url, ids, s),
            run_tool,
            self.config,
            Sampling(max_tokens=400, temperature=1.0),
            budget or Unlimited(),
        )

    def run(self, messages: list[dict[str, Any]]) -> Trajectory:
        record = self.loop.run(messages)
        self.check(record, messages)
        return record

    def check(self, record: Trajectory, messages: list[dict[str, Any]]) -> None:
        served = [Served(e.prompt, e.token_ids, e.logprobs, e.max_tokens) for e in self.llm.exchanges]
        assert_exact_against_backend(record, served)
        assert_decodes_to_conversation(record, self.renderer, messages)
        assert Trajectory.from_dict(unpack(pack(record.to_dict()))) == record


def sandbox_tool(sandbox: Sandbox):
    return lambda name, args, timeout: sandbox.call(name, args, timeout)


def test_a_tool_call_every_turn_then_finish(scripted_llm: ScriptedLLM, tokenizer: Any, sandbox: Sandbox) -> None:
    scripted_llm.scripts["work"] = [
        "I will write a file.\n" + call("bash", command="echo hello > f.txt && cat f.txt"),
        call("bash", command="ls; echo $((6*7))"),
        "All done. " + call("finish", answer="42"),
    ]
    record = Harness(scripted_llm, tokenizer, sandbox_tool(sandbox)).run(task("work"))

    assert record.stop_reason == "finish" and record.answer == "42"
    assert record.final_text == "All done. " + call("finish", answer="42")
    counts = record.counts
    assert (counts.turns, counts.tool_calls, counts.tool_errors, counts.malformed_tool_calls) == (3, 3, 0, 0)
    observations = [t for t in record.turns if t.role == OBSERVATION]
    assert len(observations) == 2, "no observation tokens after the finish call"
    assert "hello" in observations[0].text and "f.txt" in observations[1].text and "42" in observations[1].text
    first = record.turns[1]
    assert first.tool_calls[0].name == "bash" and first.tool_calls[0].exit_code == 0
    assert first.model == "scripted-policy-v1" and first.policy_version == "1" and first.finish_reason == "stop"
    assert counts.observation_tokens == sum(t.length for t in observations)
    assert set(record.timings) >= {"llm_s", "tools_s", "template_s", "total_s"}


def test_malformed_and_refused_calls_are_error_observations(
    scripted_llm: ScriptedLLM, tokenizer: Any, sandbox: Sandbox
) -> None:
    scripted_llm.scripts["sloppy"] = [
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>',
        call("rm_everything") + call("bash", cmd="ls") + call("bash", command="(exit 3)"),
        "<tool_call>" + '{"name": "finish"',
        call("finish"),
    ]
    record = Harness(scripted_llm, tokenizer, sandbox_tool(sandbox)).run(task("sloppy"))

    assert record.stop_reason == "finish" and record.answer is None
    counts = record.counts
    assert (counts.turns, counts.tool_calls, counts.malformed_tool_calls) == (4, 6, 2)
    assert counts.tool_errors == 4, "two malformed, one unknown tool, one bad argument (a failing command is no error)"
    calls = [c for t in record.turns for c in t.tool_calls]
    assert "not valid JSON" in calls[0].error and "unknown tool 'rm_everything'" in calls[1].error
    assert "missing required argument(s): command" in calls[2].error
    assert calls[3].error is None and calls[3].exit_code == 3
    assert "without a closing" in calls[4].error
    # The model saw each error: it is in the prompt of its next turn.
    second_prompt = tokenizer.decode(scripted_llm.exchanges[1].prompt)
    assert "Error: tool call is not valid JSON" in second_prompt


def test_a_turn_without_a_tool_call_stops_by_default(scripted_llm: ScriptedLLM, tokenizer: Any) -> None:
    scripted_llm.scripts["chat"] = ["The answer is 4."]
    record = Harness(scripted_llm, tokenizer, None).run(task("chat"))
    assert record.stop_reason == "no_tool_call" and record.counts.turns == 1
    assert record.final_text == "The answer is 4."


def test_without_the_stop_the_agent_is_nudged_until_max_turns(scripted_llm: ScriptedLLM, tokenizer: Any) -> None:
    scripted_llm.scripts["chat"] = ["Thinking...", "Still thinking."]
    harness = Harness(
        scripted_llm,
        tokenizer,
        None,
        stop_on_no_tool_call=False,
        max_turns=3,
        no_tool_call_message="Please use a tool.",
    )
    record = harness.run(task("chat"))
    assert record.stop_reason == "max_turns" and record.counts.turns == 3
    nudges = [t.messages for t in record.turns if t.role == OBSERVATION]
    assert nudges == [[{"role": "user", "content": "Please use a tool."}]] * 2


@pytest.mark.parametrize("room", [10, 120])
def test_the_context_limit_caps_max_tokens_and_stops_the_loop(
    scripted_llm: ScriptedLLM, tokenizer: Any, sandbox: Sandbox, room: int
) -> None:
    reply = call("bash", command="echo " + "x" * 20)
    scripted_llm.scripts["long"] = [reply] * 10
    reply_tokens = len(tokenizer.encode(reply, add_special_tokens=False)) + 1
    probe = Harness(scripted_llm, tokenizer, None).renderer
    prompt_tokens = len(probe.prompt(probe.prepare(task("long"))).token_ids)
    # room 10: the first turn fits, its observation does not; room 120: the observation fits
    # and the second turn gets only what is left, so the backend cuts it at max_tokens.
    context = prompt_tokens + reply_tokens + room
    record = Harness(scripted_llm, tokenizer, sandbox_tool(sandbox), max_context_tokens=context).run(task("long"))

    assert record.stop_reason == "context_length" and len(record.token_ids) <= context
    for exchange in scripted_llm.exchanges:
        assert exchange.max_tokens <= context - len(exchange.prompt), "a turn asked for more than the context left"
    if room == 10:
        assert record.counts.turns == 1 and "observation" in record.stop_detail
    else:
        last = scripted_llm.exchanges[-1]
        assert record.counts.turns == 2 and last.max_tokens == context - len(last.prompt) < reply_tokens
        assert last.finish_reason == "length" and record.turns[-1].finish_reason == "length"
        assert len(record.token_ids) == context


def test_a_prompt_longer_than_the_context_stops_before_any_call(scripted_llm: ScriptedLLM, tokenizer: Any) -> None:
    record = Harness(scripted_llm, tokenizer, None, max_context_tokens=50).run(task("none"))
    assert record.stop_reason == "context_length" and record.counts.turns == 0
    assert scripted_llm.exchanges == []


def test_a_prompt_over_max_prompt_tokens_fails_before_any_call(scripted_llm: ScriptedLLM, tokenizer: Any) -> None:
    scripted_llm.scripts["chat"] = ["The answer is 4."]
    harness = Harness(scripted_llm, tokenizer, None, max_prompt_tokens=50)
    with pytest.raises(PromptTooLong, match=r"has \d+ tokens, more than limits.max_prompt_tokens=50") as raised:
        harness.loop.run(task("chat"))
    assert raised.value.error_type == "prompt_too_long"
    assert scripted_llm.exchanges == [] and harness.loop.trajectory.counts.turns == 0
    tokens = len(harness.loop.trajectory.token_ids)  # the rendered prompt, kept for the job's partial
    assert f"has {tokens} tokens" in str(raised.value)
    # a prompt of exactly the limit runs
    assert Harness(scripted_llm, tokenizer, None, max_prompt_tokens=tokens).run(task("chat")).counts.turns == 1


def test_llama3_json_calls_drive_the_loop_too(scripted_llm: ScriptedLLM, tokenizer: Any, sandbox: Sandbox) -> None:
    scripted_llm.scripts["llama"] = [
        '{"name": "bash", "parameters": {"command": "echo llama"}}',
        '{"name": "finish", "parameters": {"answer": "ok"}}',
    ]
    record = Harness(scripted_llm, tokenizer, sandbox_tool(sandbox), parser="llama3_json").run(task("llama"))
    assert record.stop_reason == "finish" and record.answer == "ok" and record.tool_parser == "llama3_json"
    assert "llama" in record.turns[2].text


def stage_context(tmp_path: Path, seconds: float) -> StageContext:
    return StageContext(
        job_id="j",
        stage="rollout",
        request=JobRequest(task={"kind": "demo"}),
        outputs={},
        workspace=tmp_path,
        settings=Settings(state_dir=tmp_path),
        deadline=time.time() + seconds,
    )


def test_the_time_budget_stops_cleanly_before_the_deadline(
    scripted_llm: ScriptedLLM, tokenizer: Any, tmp_path: Path
) -> None:
    scripted_llm.scripts["slow"] = [call("bash", command="sleep 1")] * 5
    ctx = stage_context(tmp_path, 3600)

    def slow_tool(name: str, args: dict[str, Any], timeout: float | None) -> ToolResult:
        ctx.deadline = time.time() + 5  # the tool used up the stage's time but the reserve
        return ToolResult(output="slept")

    record = Harness(scripted_llm, tokenizer, slow_tool, budget=ctx, time_reserve_s=60).run(task("slow"))
    assert record.stop_reason == "time_budget" and record.counts.turns == 1


def test_cancellation_raises_and_leaves_a_consistent_partial_record(
    scripted_llm: ScriptedLLM, tokenizer: Any, tmp_path: Path
) -> None:
    scripted_llm.scripts["cancel"] = [call("bash", command="ls")] * 5
    ctx = stage_context(tmp_path, 3600)

    def cancelling_tool(name: str, args: dict[str, Any], timeout: float | None) -> ToolResult:
        if len(scripted_llm.exchanges) == 2:
            ctx.interrupt("cancelled")
        return ToolResult(output="ok")

    harness = Harness(scripted_llm, tokenizer, cancelling_tool, budget=ctx)
    with pytest.raises(StageInterrupted) as stopped:
        harness.loop.run(task("cancel"))
    assert stopped.value.reason == "cancelled"
    partial = harness.loop.trajectory
    partial.validate()
    assert partial.counts.turns == 2 and partial.turns[-1].role == "assistant"


def test_a_parser_that_raises_becomes_a_malformed_call(scripted_llm: ScriptedLLM, tokenizer: Any) -> None:
    """A parser's contract is never to raise on model output; if one does, the job still goes on."""
    scripted_llm.scripts["boom"] = ["<tool_call>anything</tool_call>", call("finish", answer="ok")]
    harness = Harness(scripted_llm, tokenizer, lambda *a: pytest.fail("no tool may run"))
    real = harness.loop.parser
    calls = []

    class Raising:
        name = real.name
        call_format = real.call_format

        def parse(self, text: str) -> Any:
            calls.append(text)
            if len(calls) == 1:
                raise RecursionError("maximum recursion depth exceeded")
            return real.parse(text)

    harness.loop.parser = Raising()
    record = harness.run(task("boom"))
    assert record.stop_reason == "finish" and record.answer == "ok"
    assert record.counts.malformed_tool_calls == 1
    error = record.turns[1].tool_calls[0].error
    assert "could not be parsed" in error and "RecursionError" in error


@pytest.mark.parametrize(
    ("remaining", "reserve", "expected"),
    [(100.0, 10.0, 60.0), (30.0, 10.0, 20.0), (10.5, 10.0, 1.0), (0.4, 10.0, 0.4), (0.0, 10.0, 0.1)],
)
def test_the_tool_timeout_never_outlasts_the_stage(remaining: float, reserve: float, expected: float) -> None:
    from types import SimpleNamespace

    config = LoopConfig(8, 4000, 400, time_reserve_s=reserve, tool_timeout_s=60.0)
    loop = SimpleNamespace(budget=SimpleNamespace(remaining=remaining), config=config)
    assert AgentLoop._tool_timeout(loop) == pytest.approx(expected)  # type: ignore[arg-type]
