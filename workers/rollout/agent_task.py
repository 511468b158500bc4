"""The rollout stage of an agentic kind: sandbox up, agent loop, collect, sandbox down.

Settings come from three places, most specific first: the task (`max_turns`,
`max_context_tokens`, `stop_on_no_tool_call`, `tool_parser`), the job
(`limits.max_turns`, `limits.max_tokens`, `limits.max_prompt_tokens`, `sampling`), then the
deployment's Settings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from shared.config import Settings
from shared.jobs.spec import SamplingParams
from shared.tasks.context import InterruptReason, StageContext, StageInterrupted
from workers.rollout.agent_loop import FINISH_TOOL, AgentLoop, Generate, LoopConfig, RunTool
from workers.rollout.chat_delta import ChatRenderer, tool_instructions_json
from workers.rollout.interruptible import call_interruptibly
from workers.rollout.job_sandbox import (
    JobSandbox,
    OnDemandSandbox,
    lifetime_for,
    name_on_record,
    new_runtime_dir,
    open_job_sandbox,
    sandbox_pool,
)
from workers.rollout.llm_completion import Completion, Sampling
from workers.rollout.llm_routing import complete_routed
from workers.rollout.llm_services import llm_services, load_tokenizer
from workers.rollout.llm_stream import TokenSink
from workers.rollout.tool_parsers import get_parser
from workers.sandbox import Sandbox, SandboxError, SandboxSpec, create_sandbox
from workers.toolserver.result import ToolResult

log = logging.getLogger("rollouts.rollout")


class AgentKind(Protocol):
    """What the rollout needs of a task kind (workers/kinds/agentic.py's AgentTask provides it)."""

    tools: tuple[str, ...]

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]: ...

    def tool_schemas(self) -> list[dict[str, Any]]: ...

    def sandbox_spec(self, task: dict[str, Any], settings: Settings) -> SandboxSpec: ...

    def collect(self, ctx: StageContext, sandbox: Any) -> dict[str, Any]: ...


def loop_config(kind: AgentKind, ctx: StageContext) -> LoopConfig:
    task, settings, request = ctx.task, ctx.settings, ctx.request
    context = min(
        settings.agent_max_context_tokens,
        request.limits.max_tokens,
        task.get("max_context_tokens") or settings.agent_max_context_tokens,
    )
    return LoopConfig(
        max_turns=task.get("max_turns") or request.limits.max_turns,
        max_context_tokens=context,
        max_tokens_per_turn=request.sampling.max_tokens or settings.agent_max_tokens_per_turn,
        max_prompt_tokens=request.limits.max_prompt_tokens,
        stop_on_no_tool_call=task.get("stop_on_no_tool_call", settings.agent_stop_on_no_tool_call),
        no_tool_call_message=settings.agent_no_tool_call_message,
        allowed_tools=tuple(kind.tools),
        # A short stage (tests, tiny tasks) keeps most of its time for the agent.
        time_reserve_s=min(settings.agent_time_reserve_s, ctx.remaining / 10),
        tool_timeout_s=settings.tool_default_timeout_s,
    )


def sampling_for(sampling: SamplingParams, max_tokens: int) -> Sampling:
    """The job's sampling parameters under vLLM's names; max_tokens is capped per turn by the loop."""
    return Sampling(
        max_tokens=max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        seed=sampling.seed,
        stop=tuple(sampling.stop),
        stop_token_ids=tuple(sampling.stop_token_ids),
        repetition_penalty=sampling.repetition_penalty,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
    )


def run_agent_task(kind: AgentKind, ctx: StageContext) -> dict[str, Any]:
    """Run `kind`'s agent on this job; returns the trajectory dict (docs/TRAJECTORY.md).

    The trajectory is pinned to its backend first: the tokenizer and chat template are those of
    the model that backend serves, and every later turn goes only to backends of that model.
    """
    settings = ctx.settings
    llm = llm_services()
    request = ctx.request
    group_id = request.group_id
    held: JobSandbox | OnDemandSandbox | None = None
    loop: AgentLoop | None = None

    def release_pin() -> None:
        # Pins are per job: once a newer attempt has superseded this one, the pin and its charge are
        # that attempt's, and releasing them would send its next turn to another backend.
        if ctx.interrupted != InterruptReason.SUPERSEDED:
            llm.pool.release(ctx.job_id)

    try:
        pin = llm.pool.acquire(ctx.job_id, group_id, model=request.model)
        parser = get_parser(ctx.task.get("tool_parser") or settings.agent_tool_parser)
        tools = kind.tool_schemas()
        renderer = ChatRenderer(
            load_tokenizer(pin),
            tools,
            tool_instructions_json(tools, parser.call_format),
            template_kwargs=request.chat_template_kwargs,
        )
        config = loop_config(kind, ctx)

        generate = pinned_generate(ctx, pin.model, release_pin)
        if any(name != FINISH_TOOL for name in kind.tools):
            held = job_sandbox(kind, ctx)
        loop = AgentLoop(
            renderer,
            parser,
            generate,
            tool_runner(held.sandbox if isinstance(held, JobSandbox) else held, ctx),
            config,
            sampling_for(request.sampling, config.max_tokens_per_turn),
            ctx,
        )
        trajectory = loop.run(kind.messages(ctx.task))
        ctx.check()
        trajectory.extra = kind.collect(ctx, collected(held))
        trajectory.sandbox = sandbox_origin(held.held if isinstance(held, OnDemandSandbox) else held)
    except StageInterrupted as stop:
        keep_partial(ctx, loop, stop.reason, None)
        raise
    except Exception as exc:
        if ctx.interrupted is not None:  # the sandbox was killed under a tool call by the interruption
            keep_partial(ctx, loop, ctx.interrupted, None)
            raise StageInterrupted(ctx.interrupted) from exc
        keep_partial(ctx, loop, "error", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        release_pin()
        if held is not None:
            held.finish()
    return trajectory.to_dict()


def pinned_generate(ctx: StageContext, model: str | None, release_pin: Callable[[], None]) -> Generate:
    """Generation for this job: routed to its pinned backend (failover included), interruptible; streamed
    when given `on_tokens` (a StreamGenerate too)."""
    llm = llm_services()
    group_id = ctx.request.group_id

    def generate(prompt: list[int], sampling: Sampling, on_tokens: TokenSink | None = None) -> Completion:
        # A cancel or the deadline does not wait for a generation in flight; if one is left
        # running, it releases the pin it may have re-taken (failover) when it ends.
        return call_interruptibly(
            ctx,
            lambda: complete_routed(
                llm.pool, llm.client, ctx.job_id, prompt, sampling, group_id=group_id, model=model, on_tokens=on_tokens
            ),
            on_abandoned=release_pin,
        )

    return generate


def job_sandbox(kind: AgentKind, ctx: StageContext) -> JobSandbox | OnDemandSandbox:
    """The job's sandbox: opened at its first tool call (``sandbox_on_demand``, the default), else now."""
    if not ctx.settings.sandbox_on_demand:
        return start_sandbox(kind, ctx)

    def open_now() -> JobSandbox:
        ctx.check()  # a cancel or the deadline before the first call starts nothing
        return start_sandbox(kind, ctx)

    def unstarted() -> Sandbox:
        return create_sandbox(kind.sandbox_spec(ctx.task, ctx.settings), ctx.workspace, new_runtime_dir(), ctx.settings)

    return OnDemandSandbox(open_now, unstarted)


def collected(held: JobSandbox | OnDemandSandbox | None) -> Any:
    """What ``collect`` gets: the running sandbox; while none was opened, the on-demand one (which opens on a
    call and runs an ``exec`` in a sandbox of its own); None for a kind without tools."""
    if held is None:
        return None
    if isinstance(held, OnDemandSandbox):
        return held.sandbox or held
    return held.sandbox


def start_sandbox(kind: AgentKind, ctx: StageContext) -> JobSandbox:
    """The job's sandbox over its workspace, started (or taken ready from the pool); stopped by a cancel,
    the deadline or the stage's end, or given back to the pool for the next job (lifetime ``reuse``)."""

    def hold(held: JobSandbox) -> None:
        name_on_record(ctx.job_id, ctx.stage, ctx.attempt, held.sandbox)  # joinable even if this worker dies
        ctx.on_cleanup(held.stop)
        ctx.on_interrupt(lambda _reason: held.stop())  # unblocks a tool call the cancel must not wait for

    try:
        held = open_job_sandbox(
            kind.sandbox_spec(ctx.task, ctx.settings),
            ctx.workspace,
            ctx.settings,
            python="python" in kind.tools,
            lifetime=lifetime_for(getattr(kind, "name", ""), ctx.settings),
            pool=sandbox_pool(ctx.settings),
            hold=hold,
        )
        origin = "ready from the pool" if held.pooled else "started for it"
        log.info("job %s: sandbox %s %s", ctx.job_id, held.sandbox.sandbox_id, origin)
        return held
    except SandboxError:
        ctx.check()  # the deadline or a cancel stopped it mid-start: timed_out/cancelled, not failed
        raise


def sandbox_origin(held: JobSandbox | None) -> str | None:
    """What the trajectory records of its sandbox: taken from the pool, started for it, or none (none was
    needed: no tool was called)."""
    if held is None:
        return None
    return "pool" if held.pooled else "started"


class ToolCaller(Protocol):
    """What runs a tool call: a started Sandbox, or an OnDemandSandbox that starts one first."""

    def call(self, tool: str, args: dict[str, Any], timeout: float | None = None) -> ToolResult: ...


def tool_runner(sandbox: ToolCaller | None, ctx: StageContext) -> RunTool:
    """Run a tool in the job's sandbox; an interruption that killed the sandbox says so, not "sandbox failed"."""

    def run_tool(name: str, args: dict[str, Any], timeout: float | None) -> ToolResult:
        if sandbox is None:
            return ToolResult.error(f"tool {name} needs a sandbox, and this task has none")
        try:
            return sandbox.call(name, args, timeout)
        except SandboxError:
            ctx.check()  # stopped by an interruption: say so, not "sandbox failed"
            raise

    return run_tool


def keep_partial(ctx: StageContext, loop: AgentLoop | None, reason: str, detail: str | None) -> None:
    """Leave the record so far in the job's partial result (cancelled, timed out, failed)."""
    if loop is None:  # stopped before the first token: nothing to keep
        return
    record = loop.trajectory
    record.stop_reason, record.stop_detail = reason, detail
    ctx.partial["trajectory"] = record.to_dict()
