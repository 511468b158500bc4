"""One external agent's rollout: each OpenAI call rendered, generated and recorded token-exactly.

The agent sends whole conversations; the service keeps the token record. A call whose messages
are an open conversation's last call's messages plus the assistant message it got back (and then
tool or user messages) extends that conversation's record by the chat template's delta only
(chat_delta.py), exactly as the built-in loop does, so nothing already recorded is re-tokenized.

A job may hold several conversations at once (sub-agents, parallel tool agents): a call extends
the open conversation whose last call it extends (most recently called first), or the one it names
in `x-rollouts-conversation`; a named conversation it does not extend gets a new segment (the old
one closed with `stop_reason: new_segment`); any other call starts a new conversation (`c0`, `c1`,
...). Every segment names its conversation and every assistant turn its call's index across the
job, so the order of calls survives the split; the result is the last call's segment, with all
the others in `segments` in the order they opened.

Calls of one job are serialized (one lock): the records are sequences, and a call that fails is
taken back whole before the next one looks at them.

A streamed chat call (`on_progress`) generates through `generate_stream`: the same request, the
same record, with the reply's text handed on as the tokens arrive, as far as the tool parser is
sure it begins the message content (`ToolParser.streamable`); the rest (and the tool calls) is
in the answer at the end.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from typing import Any

from shared.tasks.context import StageInterrupted
from shared.tool_schemas import validate_call
from shared.trajectory import OBSERVATION, ToolCallRecord, Trajectory, Turn
from workers.rollout.agent_loop import (
    FINISH_TOOL,
    Generate,
    LoopConfig,
    PromptTooLong,
    RunTool,
    StreamGenerate,
    check_prompt_length,
)
from workers.rollout.chat_delta import ChatRenderer, ChatTemplateError, tool_instructions_json
from workers.rollout.external_agent import wire
from workers.rollout.external_agent.conversations import Conversations, Savepoint, Segment
from workers.rollout.external_agent.messages import canonical, wire_tool_call
from workers.rollout.external_agent.streaming import OnProgress, Progress
from workers.rollout.llm_completion import Completion, Sampling, assistant_turn
from workers.rollout.llm_errors import BackendRequestError
from workers.rollout.llm_stream import TokenSink
from workers.rollout.tool_parsers import ParsedCall, ParseResult, ToolParser

_OVERLAP = 4  # tokens decoded again before the new ones, so a token's text does not depend on where a window starts


class ExternalAgentSession:
    """The state of one job's external agent; every public method is one HTTP call."""

    def __init__(
        self,
        tokenizer: Any,
        parser: ToolParser,
        generate: Generate,
        run_tool: RunTool,
        config: LoopConfig,
        sampling: Sampling,
        model: str,
        template_kwargs: dict[str, Any] | None = None,
        max_conversations: int = 32,
        generate_stream: StreamGenerate | None = None,
    ) -> None:
        self.tokenizer, self.parser, self.generate, self._run_tool = tokenizer, parser, generate, run_tool
        self.config, self.sampling, self.model = config, sampling, model
        self.template_kwargs = template_kwargs or {}
        self.generate_stream = generate_stream  # None: a streamed call's text comes at its end
        self.closed: str | None = None  # why the rollout ended; calls after it get 409
        self.finished = threading.Event()
        self.answer: str | None = None
        self.tool_runs: list[dict[str, Any]] = []
        self._conversations = Conversations(max_conversations)
        self._recorded = 0  # calls recorded, every conversation: the next call's index
        self._calls = 0
        self._call_ids = 0
        self._renderers: dict[str, ChatRenderer] = {}
        self._lock = threading.Lock()
        self._special_ids = set(tokenizer.all_special_ids)
        self._started = time.perf_counter()
        self._llm_s = 0.0

    # --- the calls -----------------------------------------------------------------
    def chat(
        self, request: wire.ChatRequest, conversation: str | None = None, on_progress: OnProgress | None = None
    ) -> dict[str, Any]:
        """A chat.completion for `request`, its tokens appended to its conversation's record (`conversation`:
        the id the agent named, else the open conversation it extends, else a new one); `on_progress` gets
        the reply's text as it is generated (the first tokens call it even without text)."""
        with self._lock:
            self._check_open(request.model)
            messages = canonical(request.messages)
            savepoint = self._conversations.savepoint()
            segment = self._extend_chat(messages, request.tools, conversation)
            completion = self._generate_or_undo(
                savepoint,
                segment.record,
                request.max_completion_tokens or request.max_tokens,
                wire.stops_of(request.stop),
                self._streamer(segment, on_progress),
            )
            prompt_tokens = len(segment.record.token_ids)
            ends_on_token = completion.ends_on_stop_token(self._special_ids)
            assert segment.renderer is not None
            content, segment.stop_text = segment.renderer.split_generation(completion.token_ids, ends_on_token)
            turn = self._record(segment, completion, content)
            message, finish_reason = self._message(segment.record, content, turn, completion)
            segment.conversation = [*messages, canonical([message])[0]]
            counts = wire.usage(prompt_tokens, len(completion.token_ids))
            return wire.chat_response(
                f"chatcmpl-{self._calls}", self.model, message, finish_reason, counts, completion.stop_reason
            )

    def complete(self, request: wire.CompletionRequest, conversation: str | None = None) -> dict[str, Any]:
        """A text_completion for `request`: the prompt continued, its tokens appended to its conversation's
        record (a prompt that starts with an open text conversation's record extends it)."""
        with self._lock:
            self._check_open(request.model)
            savepoint = self._conversations.savepoint()
            segment = self._extend_text(request.prompt, conversation)
            completion = self._generate_or_undo(
                savepoint, segment.record, request.max_tokens, wire.stops_of(request.stop)
            )
            prompt_tokens = len(segment.record.token_ids)
            text = self._decode(completion.token_ids)
            self._record(segment, completion, text)
            counts = wire.usage(prompt_tokens, len(completion.token_ids))
            return wire.text_response(
                f"cmpl-{self._calls}", self.model, text, completion.finish_reason or "stop", counts
            )

    def run_tool(self, name: str, arguments: Any) -> dict[str, Any]:
        """Run one of the job's tools in its sandbox; the run is recorded under `extra.tool_runs`."""
        allowed = [t for t in self.config.allowed_tools if t != FINISH_TOOL]
        if name not in allowed:
            raise wire.ExternalAgentError(404, f"no tool {name!r} in this job; its tools: {', '.join(allowed)}", "name")
        problem = validate_call(name, arguments)
        if problem is not None:
            raise wire.ExternalAgentError(400, problem, "arguments")
        with self._lock:
            self._check_open(None)
            try:
                result = self._run_tool(name, arguments, self.config.tool_timeout_s)
            except StageInterrupted as exc:
                raise wire.ExternalAgentError(
                    409, f"this job's rollout has ended ({exc.reason})", None, "conflict"
                ) from exc
            except Exception as exc:  # the sandbox failed: said so, the job goes on
                raise wire.ExternalAgentError(
                    502, f"the tool could not run: {type(exc).__name__}: {exc}", None, "server_error"
                ) from exc
            self.tool_runs.append({"name": name, "arguments": arguments, **result.to_dict()})
            return result.to_dict()

    def finish(self, answer: str | None) -> None:
        """End the rollout: the record is complete and goes to evaluation."""
        with self._lock:
            self._check_open(None)
            self.answer = answer
            self._close("finish")

    @property
    def busy(self) -> bool:
        """A call holds the session now (a streamed one, in its own thread)."""
        return self._lock.locked()

    def end(self, reason: str, detail: str | None = None) -> None:
        """End it from the stage (time budget, interruption); a call in flight completes first."""
        with self._lock:
            if self.closed is None:
                self._close(reason, detail)

    def record(self) -> Trajectory:
        """The final record: the last call's segment, with every other one in `segments` (in opening order).
        A copy of the segment's record, so one asked for mid-run leaves nothing behind in a segment that is
        not the last one later."""
        with self._lock:
            last_segment = self._conversations.last
            top = last_segment.record if last_segment is not None else self._empty_record()
            last = replace(
                top,
                segments=[s.record.to_dict() for s in self._conversations.segments if s is not last_segment],
                answer=self.answer,
                stop_reason=top.stop_reason or self.closed,
                timings={"llm_s": self._llm_s, "total_s": time.perf_counter() - self._started},
                extra={**top.extra, "tool_runs": list(self.tool_runs)},
            )
            last.validate()
            return last

    # --- extending the record ---------------------------------------------------------
    def _extend_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, named: str | None
    ) -> Segment:
        segment = next((s for s in self._conversations.candidates(named) if s.extended_by(messages, tools)), None)
        try:
            if segment is not None:
                assert segment.renderer is not None
                n = len(segment.conversation)
                delta = segment.renderer.observation(segment.stop_text, messages[n:])
                self._fits(segment.record, len(delta.token_ids))
                segment.record.append(
                    Turn(role=OBSERVATION, start=0, end=0, text=delta.text, messages=messages[n:]), delta.token_ids
                )
                return segment
            renderer = self._renderer(tools or None)
            prompt = renderer.prompt(renderer.prepare(messages))
        except ChatTemplateError as exc:
            raise wire.ExternalAgentError(400, str(exc), "messages") from exc
        return self._new_segment(
            Segment(self._fresh_record(), renderer, tools or None), prompt.token_ids, prompt.text, named
        )

    def _renderer(self, tools: list[dict[str, Any]] | None) -> ChatRenderer:
        """The renderer for a conversation with `tools`, built once per tool list (building one reads the
        tokenizer's whole added vocabulary)."""
        key = json.dumps(tools, sort_keys=True)
        if key not in self._renderers:
            if len(self._renderers) >= 8:  # an agent that changes its tools every call: keep a few
                self._renderers.pop(next(iter(self._renderers)))
            self._renderers[key] = ChatRenderer(
                self.tokenizer,
                tools,
                tool_instructions_json(tools or [], self.parser.call_format),
                template_kwargs=self.template_kwargs,
            )
        return self._renderers[key]

    def _extend_text(self, prompt: str | list[int], named: str | None) -> Segment:
        for segment in self._conversations.candidates(named):
            if segment.renderer is not None:
                continue
            held = segment.record.token_ids
            if isinstance(prompt, list):
                if len(prompt) > len(held) and prompt[: len(held)] == held:
                    return self._observe(segment, prompt[len(held) :], self._decode(prompt[len(held) :]))
                continue
            before = self._decode(held)
            if len(prompt) > len(before) and prompt.startswith(before):
                suffix = prompt[len(before) :]
                return self._observe(segment, self._encode(suffix, special=False), suffix)
        fresh = Segment(self._fresh_record(), None, None)
        if isinstance(prompt, list):
            return self._new_segment(fresh, prompt, self._decode(prompt), named)
        return self._new_segment(fresh, self._encode(prompt, special=True), prompt, named)

    def _observe(self, segment: Segment, token_ids: list[int], text: str) -> Segment:
        self._fits(segment.record, len(token_ids))
        segment.record.append(Turn(role=OBSERVATION, start=0, end=0, text=text), token_ids)
        return segment

    def _new_segment(self, segment: Segment, token_ids: list[int], text: str, named: str | None) -> Segment:
        """Open `segment` in the named conversation (closing its open segment as `new_segment`), else in a new one;
        a prompt over the job's `limits.max_prompt_tokens` is refused as one past its context is."""
        try:
            check_prompt_length(len(token_ids), self.config.max_prompt_tokens)
        except PromptTooLong as exc:
            raise wire.ExternalAgentError(400, str(exc), "messages") from exc
        if len(token_ids) >= self.config.max_context_tokens:
            raise wire.ExternalAgentError(
                400,
                f"the prompt has {len(token_ids)} tokens; the job's context is {self.config.max_context_tokens}",
                "messages",
            )
        return self._conversations.start(segment, token_ids, text, named)

    def _fits(self, record: Trajectory, more: int) -> None:
        if len(record.token_ids) + more >= self.config.max_context_tokens:
            raise wire.ExternalAgentError(
                400,
                f"this call's new messages ({more} tokens) do not fit the job's context of "
                f"{self.config.max_context_tokens} tokens",
                "messages",
            )

    # --- a call that fails leaves the record as it was ---------------------------------
    def _generate_or_undo(
        self,
        savepoint: Savepoint,
        record: Trajectory,
        asked: int | None,
        stops: tuple[str, ...],
        on_tokens: TokenSink | None = None,
    ) -> Completion:
        """Generate; if that fails, take back what this call added (a new segment, or the observation), so
        the agent's retry of the same call extends the record exactly once."""
        try:
            return self._generate(record, asked, stops, on_tokens)
        except BaseException:
            self._conversations.undo(savepoint)
            raise

    # --- generating and recording ------------------------------------------------------
    def _streamer(self, segment: Segment, on_progress: OnProgress | None) -> TokenSink | None:
        """The token sink of a streamed call: the reply's text so far (whole characters, less a trailing
        end-of-turn or stop token, which the content leaves out), as far as the parser is sure of it."""
        if on_progress is None or self.generate_stream is None or segment.renderer is None:
            return None
        decode, held = segment.renderer.decode, self._special_ids | set(self.sampling.stop_token_ids)
        tokens: list[int] = []
        state = {"done": 0, "done_text": "", "sent": "", "started": False}

        def take(ids: list[int]) -> None:
            tokens.extend(ids)
            end = len(tokens)
            while end > state["done"] and tokens[end - 1] in held:
                end -= 1
            start = max(0, state["done"] - _OVERLAP)  # decode a window, its first tokens again (see _OVERLAP)
            window = decode(tokens[start:end])[len(decode(tokens[start : state["done"]])) :]
            text = state["done_text"] + window
            if not text.endswith("\ufffd") and end - state["done"] > 4 * _OVERLAP:  # whole characters: keep them
                state["done"], state["done_text"] = end, text
            shown = self._streamable(text.rstrip("\ufffd"))
            new = shown[len(state["sent"]) :] if shown.startswith(state["sent"]) else ""
            if new or not state["started"]:
                state["started"], state["sent"] = True, state["sent"] + new
                on_progress(Progress(f"chatcmpl-{self._calls}", len(segment.record.token_ids), new))

        return take

    def _streamable(self, text: str) -> str:
        try:
            return self.parser.streamable(text)
        except Exception:  # noqa: BLE001 - model output never fails the call: the text comes at the end
            return ""

    def _generate(
        self, record: Trajectory, asked: int | None, stops: tuple[str, ...], on_tokens: TokenSink | None = None
    ) -> Completion:
        turns = self._recorded  # every conversation's turns
        if turns >= self.config.max_turns:
            raise wire.ExternalAgentError(
                409, f"the job's {self.config.max_turns} turns are used up; POST finish", None, "conflict"
            )
        left = self.config.max_context_tokens - len(record.token_ids)
        cap = min(asked or self.config.max_tokens_per_turn, self.config.max_tokens_per_turn, left)
        seed = None if self.sampling.seed is None else (self.sampling.seed + turns) % 2**63
        sampling = replace(self.sampling, max_tokens=cap, seed=seed, stop=(*self.sampling.stop, *stops))
        self._calls += 1
        t0 = time.perf_counter()
        try:
            if on_tokens is None or self.generate_stream is None:
                completion = self.generate(list(record.token_ids), sampling)
            else:
                completion = self.generate_stream(list(record.token_ids), sampling, on_tokens)
        except BackendRequestError as exc:
            raise wire.ExternalAgentError(400, f"the model refused the request: {exc.message}", None) from exc
        except StageInterrupted as exc:  # cancelled or out of time mid-generation: the rollout is over
            raise wire.ExternalAgentError(
                409, f"this job's rollout has ended ({exc.reason})", None, "conflict"
            ) from exc
        except Exception as exc:  # no backend, or it failed: the agent's call fails, not the job
            raise wire.ExternalAgentError(
                502, f"the model could not answer: {type(exc).__name__}: {exc}", None, "server_error"
            ) from exc
        finally:
            self._llm_s += time.perf_counter() - t0
        if len(completion.token_ids) > cap or len(completion.logprobs) != len(completion.token_ids):
            raise wire.ExternalAgentError(
                502, f"backend {completion.backend_id} broke the token contract", None, "server_error"
            )
        return completion

    def _record(self, segment: Segment, completion: Completion, content: str) -> Turn:
        """Append the generation as the call's assistant turn; its conversation becomes the most recent."""
        turn = assistant_turn(completion, self._decode(completion.token_ids), call=self._recorded)
        segment.record.append(turn, completion.token_ids, completion.logprobs)
        segment.record.final_text = content
        self._recorded += 1
        self._conversations.called(segment)
        return turn

    def _message(
        self, record: Trajectory, content: str, turn: Turn, completion: Completion
    ) -> tuple[dict[str, Any], str]:
        """The assistant message: tool calls parsed with the model's parser. As vLLM does, a reply with a
        malformed call comes back whole as text, without tool_calls; the turn records the malformed call."""
        parsed = self._parse(content)
        counts = record.counts
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
        for call in parsed.calls:
            counts.tool_calls += 1
            turn.tool_calls.append(
                ToolCallRecord(name=call.name, arguments=call.arguments, raw=call.raw, error=call.error)
            )
        if any(call.error is not None for call in parsed.calls):
            counts.malformed_tool_calls += sum(call.error is not None for call in parsed.calls)
            return {"role": "assistant", "content": content}, self._finish_reason(completion, False)
        if parsed.calls:
            message["tool_calls"] = [wire_tool_call(self._call_id(), c.name or "", c.arguments) for c in parsed.calls]
        return message, self._finish_reason(completion, bool(parsed.calls))

    def _parse(self, content: str) -> ParseResult:
        try:
            return self.parser.parse(content)
        except Exception as exc:  # noqa: BLE001 - model output never fails the job (the loop does the same)
            return ParseResult(content=content, calls=[ParsedCall(raw=content, error=f"{type(exc).__name__}: {exc}")])

    def _call_id(self) -> str:
        self._call_ids += 1
        return f"call{self._call_ids:05d}"  # 9 alphanumerics: the only form Mistral's templates take

    @staticmethod
    def _finish_reason(completion: Completion, calls: bool) -> str:
        if calls:
            return "tool_calls"
        return "length" if completion.finish_reason == "length" else "stop"

    # --- small pieces --------------------------------------------------------------
    def _check_open(self, model: str | None) -> None:
        if self.closed is not None:
            raise wire.ExternalAgentError(409, f"this job's rollout has ended ({self.closed})", None, "conflict")
        if model is not None and model != self.model:
            raise wire.ExternalAgentError(400, f"this job samples from model {self.model!r}, not {model!r}", "model")

    def _close(self, reason: str, detail: str | None = None) -> None:
        self.closed = reason
        for segment in self._conversations.open.values():  # every open conversation ends with the rollout
            segment.record.stop_reason, segment.record.stop_detail = reason, detail
        self.finished.set()

    def _fresh_record(self) -> Trajectory:
        return Trajectory(tokenizer=str(self.tokenizer.name_or_path), tool_parser=self.parser.name)

    def _empty_record(self) -> Trajectory:
        record = self._fresh_record()
        record.stop_reason = self.closed
        return record

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _encode(self, text: str, special: bool) -> list[int]:
        """A text prompt's ids as vLLM's /v1/completions makes them (`special`: the tokenizer's BOS first); the
        text must come back from them, or the record's text and its tokens would disagree."""
        ids = self.tokenizer.encode(text, add_special_tokens=special)
        back = self._decode(ids)
        bos = self.tokenizer.bos_token
        if back != text and not (special and bos and back == bos + text):
            raise wire.ExternalAgentError(
                400, "the prompt does not survive encode/decode with the model's tokenizer", "prompt"
            )
        return ids
