"""The multi-turn agent loop: generate from the token record, run tool calls, append the observation delta.

One `AgentLoop` runs one trajectory. Each turn sends the whole token record to the
backend, appends the returned token IDs and logprobs verbatim, decodes them, parses
the tool calls, runs them, and appends only the chat-template delta of the
observation (chat_delta.py). Nothing already in the record is ever re-tokenized, so
the record is exactly what the model saw and produced, whichever backend served
which turn.

Stops (recorded as `stop_reason`): the finish tool, a turn without a tool call (if
configured), max turns, the context (no room for another generation or for the next
observation; a turn's max_tokens never exceeds what is left), the stage's time
budget (a clean stop `time_reserve_s` before the deadline), and cancellation or the
hard deadline (StageInterrupted from `budget.check()`, with the partial record left
in `loop.trajectory`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from shared.errors import JobInputError, RolloutsError
from shared.tool_schemas import validate_call
from shared.trajectory import OBSERVATION, PROMPT, ToolCallRecord, Trajectory, Turn
from workers.rollout.chat_delta import ChatRenderer
from workers.rollout.llm_completion import Completion, Sampling, assistant_turn
from workers.rollout.llm_errors import BackendRequestError
from workers.rollout.tool_parsers import ParsedCall, ParseResult, ToolParser
from workers.toolserver.result import ToolResult

FINISH_TOOL = "finish"
# vLLM's (and the CPU backend's) 400 for a request past the model's context.
# vLLM's 400 for a prompt past the context, in the wording of /v1/completions ("This model's maximum
# context length is N tokens", vllm/renderers/params.py) and of /inference/v1/generate, whose prompt
# reaches the engine's own check ("... longer than the maximum model length of N", v1/engine/input_processor.py).
_CONTEXT_ERROR = re.compile(r"maximum (?:context length is|model length of) (\d+)")

Generate = Callable[[list[int], Sampling], Completion]
# The same, streamed: the third argument takes each chunk's new token ids as the backend generates them.
StreamGenerate = Callable[[list[int], Sampling, Callable[[list[int]], None]], Completion]
RunTool = Callable[[str, dict[str, Any], "float | None"], ToolResult]


class Budget(Protocol):
    """What the loop needs of its stage: StageContext fits."""

    @property
    def remaining(self) -> float: ...

    def check(self) -> None: ...


class BackendProtocolError(RolloutsError, RuntimeError):
    """The backend's answer breaks the token contract (more tokens than asked, logprobs misaligned)."""


class PromptTooLong(JobInputError):
    """The rendered first prompt is longer than the job's `limits.max_prompt_tokens`: the job fails before any
    generation (a trainer that pads prompts to that length would cut or drop the row after the rollout)."""

    error_type = "prompt_too_long"


@dataclass(frozen=True)
class LoopConfig:
    max_turns: int
    max_context_tokens: int  # the whole record, prompt included
    max_tokens_per_turn: int
    stop_on_no_tool_call: bool = True
    no_tool_call_message: str = "No tool call found. Call a tool, or call finish when you are done."
    allowed_tools: tuple[str, ...] = ()
    time_reserve_s: float = 0.0
    tool_timeout_s: float = 60.0
    max_prompt_tokens: int | None = None  # the job's limit on the rendered first prompt (None: none)


MIN_TOOL_TIMEOUT_S = 1.0


def check_prompt_length(tokens: int, limit: int | None) -> None:
    """PromptTooLong when a rendered prompt of `tokens` is over the job's `limits.max_prompt_tokens`."""
    if limit is not None and tokens > limit:
        raise PromptTooLong(
            f"the rendered prompt has {tokens} tokens, more than limits.max_prompt_tokens={limit}; "
            "nothing was generated (shorten the prompt or raise the limit)"
        )


class _Stop(Exception):
    def __init__(self, reason: str, detail: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


@dataclass(eq=False)
class AgentLoop:
    """Runs one trajectory; `trajectory` holds the record so far, also when `run` raises."""

    renderer: ChatRenderer
    parser: ToolParser
    generate: Generate
    run_tool: RunTool
    config: LoopConfig
    sampling: Sampling
    budget: Budget

    def __post_init__(self) -> None:
        self.trajectory = Trajectory(tokenizer=str(self.renderer.tokenizer.name_or_path), tool_parser=self.parser.name)
        self._special_ids = set(self.renderer.tokenizer.all_special_ids)
        self._timings = {"llm_s": 0.0, "tools_s": 0.0, "template_s": 0.0}
        self.context_tokens = self.config.max_context_tokens  # lowered if a backend's context is smaller
        self._context_note: str | None = None

    # --- the loop ------------------------------------------------------------------
    def run(self, messages: list[dict[str, Any]]) -> Trajectory:
        started = time.perf_counter()
        try:
            self._start(messages)
            while True:
                self._turn()
        except _Stop as stop:
            self.trajectory.stop_reason, self.trajectory.stop_detail = stop.reason, stop.detail
        finally:
            self.trajectory.timings = {**self._timings, "total_s": time.perf_counter() - started}
        self.trajectory.validate()
        return self.trajectory

    def _start(self, messages: list[dict[str, Any]]) -> None:
        t0 = time.perf_counter()
        prompt = self.renderer.prompt(self.renderer.prepare(messages))
        self._timings["template_s"] += time.perf_counter() - t0
        self.trajectory.append(Turn(role=PROMPT, start=0, end=0, text=prompt.text), prompt.token_ids)
        check_prompt_length(len(prompt.token_ids), self.config.max_prompt_tokens)
        if len(prompt.token_ids) >= self.context_tokens:
            raise _Stop("context_length", f"the prompt has {len(prompt.token_ids)} tokens")

    def _turn(self) -> None:
        cfg, record = self.config, self.trajectory
        self.budget.check()
        if self.budget.remaining < cfg.time_reserve_s:
            raise _Stop("time_budget", f"{self.budget.remaining:.1f}s left of the stage")
        completion = self._generate_within_context()
        stopped_on_token = completion.ends_on_stop_token(self._special_ids)
        content, stop_text = self.renderer.split_generation(completion.token_ids, stopped_on_token)
        parsed = self._parse(content)
        turn = assistant_turn(completion, self.renderer.decode(completion.token_ids))
        record.append(turn, completion.token_ids, completion.logprobs)
        record.final_text = content

        observation, finished, tools_s = self._run_calls(parsed.calls, turn)
        if finished:
            raise _Stop("finish")
        if not parsed.calls:
            if cfg.stop_on_no_tool_call:
                raise _Stop("no_tool_call")
            observation = [{"role": "user", "content": cfg.no_tool_call_message}]
        if record.counts.turns >= cfg.max_turns:
            raise _Stop("max_turns")

        t0 = time.perf_counter()
        delta = self.renderer.observation(stop_text, observation)
        self._timings["template_s"] += time.perf_counter() - t0
        if len(record.token_ids) + len(delta.token_ids) >= self.context_tokens:
            raise _Stop("context_length", f"the next observation ({len(delta.token_ids)} tokens) does not fit")
        self.budget.check()
        obs_turn = Turn(role=OBSERVATION, start=0, end=0, text=delta.text, messages=observation, duration_s=tools_s)
        record.append(obs_turn, delta.token_ids)

    # --- pieces ------------------------------------------------------------------
    def _parse(self, content: str) -> ParseResult:
        """The parser's reading of `content`; a parser that raises anyway (its contract is never to)
        yields one malformed call, so the model sees an error observation and the job goes on."""
        try:
            return self.parser.parse(content)
        except Exception as exc:  # noqa: BLE001 - model output must never fail the job
            error = f"the tool call could not be parsed: {type(exc).__name__}: {str(exc)[:200]}"
            return ParseResult(content=content, calls=[ParsedCall(raw=content, error=error)])

    def _generate_within_context(self) -> Completion:
        """One generation whose max_tokens fits what is left of the context.

        A backend whose context is smaller than configured answers 400 with its limit
        (vLLM's wording): the loop adopts the limit and asks again, or stops if no room is left.
        """
        while True:
            left = self.context_tokens - len(self.trajectory.token_ids)
            if left <= 0:
                raise _Stop("context_length", self._context_note)
            cap = self.config.max_tokens_per_turn
            asked = min(self.sampling.max_tokens or cap, cap, left)
            # Turn k samples with seed + k: the same seed every turn would restart one random stream each turn.
            seed = self.sampling.seed
            if seed is not None:
                seed = (seed + self.trajectory.counts.turns) % 2**63
            try:
                return self._generate(replace(self.sampling, max_tokens=asked, seed=seed), asked)
            except BackendRequestError as exc:
                found = _CONTEXT_ERROR.search(exc.message)
                if found is None or int(found.group(1)) >= self.context_tokens:
                    raise
                self.context_tokens = int(found.group(1))
                self._context_note = f"backend {exc.backend_id} has a context of {self.context_tokens} tokens"

    def _generate(self, sampling: Sampling, asked: int) -> Completion:
        t0 = time.perf_counter()
        try:
            completion = self.generate(list(self.trajectory.token_ids), sampling)
        finally:
            self._timings["llm_s"] += time.perf_counter() - t0
        n = len(completion.token_ids)
        if n > asked or len(completion.logprobs) != n:
            raise BackendProtocolError(
                f"backend {completion.backend_id} returned {n} tokens and {len(completion.logprobs)} logprobs "
                f"for max_tokens={asked}"
            )
        return completion

    def _run_calls(self, calls: list[ParsedCall], turn: Turn) -> tuple[list[dict[str, Any]], bool, float]:
        """Run the turn's calls in order (a malformed one is an error observation); stop at finish."""
        counts = self.trajectory.counts
        observation: list[dict[str, Any]] = []
        finished = False
        started = time.perf_counter()
        for call in calls:
            counts.tool_calls += 1
            record = ToolCallRecord(name=call.name, arguments=call.arguments, raw=call.raw)
            if call.error is not None:
                counts.malformed_tool_calls += 1
                record.error = call.error
            elif call.name not in self.config.allowed_tools:
                record.error = f"unknown tool {call.name!r}; available tools: {', '.join(self.config.allowed_tools)}"
            else:
                record.error = validate_call(call.name, call.arguments)
            if record.error is not None:
                result = ToolResult.error(f"Error: {record.error}")
            elif call.name == FINISH_TOOL:
                answer = (call.arguments or {}).get("answer")
                self.trajectory.answer = answer
                result = ToolResult(output="Finished.", finished=True)
                finished = True
            else:
                self.budget.check()
                result = self.run_tool(call.name, call.arguments or {}, self._tool_timeout())
            record.output, record.is_error = result.output, result.is_error
            record.exit_code, record.truncated = result.exit_code, result.truncated
            record.timed_out, record.duration_s = result.timed_out, result.duration_s
            if result.is_error:
                counts.tool_errors += 1
            turn.tool_calls.append(record)
            # tool_call_id: 9 alphanumerics, the only form Mistral's templates take.
            observation.append(
                {
                    "role": "tool",
                    "name": call.name or "invalid",
                    "content": result.output,
                    "tool_call_id": f"call{counts.tool_calls:05d}",
                }
            )
            if finished:
                break
        elapsed = time.perf_counter() - started
        self._timings["tools_s"] += elapsed
        return observation, finished, elapsed

    def _tool_timeout(self) -> float:
        """The configured tool timeout, but never past the point where the loop must stop
        (remaining - time_reserve_s). With less room than MIN_TOOL_TIMEOUT_S left (several calls in
        one turn), a call may use up to that minimum of the reserve, but never more than what is
        left of the stage itself."""
        room = self.budget.remaining - self.config.time_reserve_s
        timeout = min(self.config.tool_timeout_s, room)
        if timeout >= MIN_TOOL_TIMEOUT_S:
            return timeout
        return max(0.1, min(MIN_TOOL_TIMEOUT_S, self.budget.remaining))
