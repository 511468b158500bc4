"""The rollout stage of a job whose agent runs elsewhere (`"agent": "external"`).

The stage does what it does for the built-in loop (pin a backend, load its tokenizer, start the
sandbox), then serves the job's ExternalAgentSession on a port of its own and says where in Redis
(`Keys.external_agent_endpoint`), so the API can forward the agent's calls. It holds its slot until the agent
calls finish, the stage's time budget runs out (`time_budget`, then evaluation as usual) or the
job is cancelled; then it collects like any agentic rollout and hands the record to eval.
"""

from __future__ import annotations

from typing import Any

from shared.external_agent_tokens import deployment_secret
from shared.tasks.context import InterruptReason, StageContext, StageInterrupted
from shared.thread_server import ThreadServer
from workers.rollout.agent_loop import FINISH_TOOL
from workers.rollout.agent_task import (
    AgentKind,
    loop_config,
    pinned_generate,
    sampling_for,
    sandbox_origin,
    start_sandbox,
    tool_runner,
)
from workers.rollout.external_agent.server import build_app, endpoint_server
from workers.rollout.external_agent.session import ExternalAgentSession
from workers.rollout.job_sandbox import JobSandbox
from workers.rollout.llm_services import llm_services, load_tokenizer
from workers.rollout.tool_parsers import get_parser
from workers.sandbox import Sandbox

WAIT_STEP_S = 0.5  # how often the holding slot looks at the deadline and the cancel flag


def run_external_agent(kind: AgentKind, ctx: StageContext) -> dict[str, Any]:
    """Serve the job's agent endpoint until the rollout ends; returns the trajectory dict."""
    from workers.runtime.state import state

    st = state()
    llm = llm_services()
    sandbox: Sandbox | None = None
    held: JobSandbox | None = None
    session: ExternalAgentSession | None = None
    server: ThreadServer | None = None
    endpoint_key = st.store.keys.external_agent_endpoint(ctx.job_id)

    def release_pin() -> None:
        if ctx.interrupted != InterruptReason.SUPERSEDED:
            llm.pool.release(ctx.job_id)

    try:
        pin = llm.pool.acquire(ctx.job_id, ctx.request.group_id, model=ctx.request.model)
        config = loop_config(kind, ctx)
        if any(name != FINISH_TOOL for name in kind.tools):
            held = start_sandbox(kind, ctx)
            sandbox = held.sandbox
        generate = pinned_generate(ctx, pin.model, release_pin)
        session = ExternalAgentSession(
            load_tokenizer(pin),
            get_parser(ctx.task.get("tool_parser") or ctx.settings.agent_tool_parser),
            generate,
            tool_runner(sandbox, ctx),
            config,
            sampling_for(ctx.request.sampling, config.max_tokens_per_turn),
            pin.model,
            template_kwargs=ctx.request.chat_template_kwargs,
            max_conversations=ctx.settings.external_agent_max_conversations,
            generate_stream=generate,
        )
        secret = deployment_secret(st.redis, st.store.keys, ctx.settings)
        task = {"messages": kind.messages(ctx.task), "tools": kind.tool_schemas(), "model": pin.model}
        server = endpoint_server(build_app(session, ctx.job_id, secret, lambda: task), ctx.settings.external_agent_host)
        server.start()
        st.redis.set(endpoint_key, server.url, ex=max(1, int(ctx.remaining) + 60))
        st.redis.publish(st.store.keys.job_events, f"{ctx.job_id} serving")  # API processes drop their old route
        _hold(session, ctx, config.time_reserve_s)
        ctx.check()
        trajectory = session.record()
        trajectory.extra = {**trajectory.extra, **kind.collect(ctx, sandbox)}
        trajectory.sandbox = sandbox_origin(held)
    except StageInterrupted as stop:
        _keep_partial(ctx, session, stop.reason, None)
        raise
    except Exception as exc:
        reason = ctx.interrupted or "error"
        _keep_partial(ctx, session, reason, None if ctx.interrupted else f"{type(exc).__name__}: {exc}")
        if ctx.interrupted is not None:
            raise StageInterrupted(ctx.interrupted) from exc
        raise
    finally:
        if server is not None:
            _unregister(st.redis, endpoint_key, server.url)
            server.stop()
        release_pin()
        if held is not None:
            held.finish()
    return trajectory.to_dict()


def _hold(session: ExternalAgentSession, ctx: StageContext, reserve_s: float) -> None:
    """Wait for finish; end the session on the time budget (a clean stop) or an interruption."""
    while not session.finished.wait(min(WAIT_STEP_S, max(0.0, ctx.remaining - reserve_s))):
        if ctx.interrupted is not None:
            session.end(ctx.interrupted)
            ctx.check()
        if ctx.remaining <= reserve_s:
            session.end("time_budget", f"{ctx.remaining:.1f}s left of the stage")
            return


def _keep_partial(ctx: StageContext, session: ExternalAgentSession | None, reason: str, detail: str | None) -> None:
    """Leave the record so far in the job's partial result (cancelled, timed out, failed)."""
    if session is None:
        return
    session.end(reason, detail)
    ctx.partial["trajectory"] = session.record().to_dict()


def _unregister(redis: Any, key: str, url: str) -> None:
    """Remove this attempt's address; a newer attempt of the job (superseding this one) keeps its own."""
    held = redis.get(key)
    if held is not None and (held.decode() if isinstance(held, bytes) else held) == url:
        redis.delete(key)
