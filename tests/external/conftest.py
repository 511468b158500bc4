"""Fixtures of the external-agent tests: one job's ExternalAgentSession served on its own port, as a rollout worker serves it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shared.external_agent_tokens import job_token
from shared.kinds.agentic import DEFAULT_TOOLS
from shared.tool_schemas import TOOL_SCHEMAS
from tests.support.sandboxes import running_sandbox
from tests.support.trajectory_checks import Served
from workers.rollout.agent_loop import LoopConfig
from workers.rollout.chat_delta import ChatRenderer, tool_instructions_json
from workers.rollout.external_agent.server import build_app, endpoint_server
from workers.rollout.external_agent.session import ExternalAgentSession
from workers.rollout.llm_client import LLMClient
from workers.rollout.llm_completion import Completion, Sampling
from workers.rollout.llm_stream import TokenSink
from workers.rollout.tool_parsers import get_parser
from workers.sandbox import Sandbox

SECRET = b"test-secret-0123456789abcdef"
JOB = "job-under-test"
TOOLS = [s for s in TOOL_SCHEMAS if s["function"]["name"] in DEFAULT_TOOLS]
TASK = [{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model, local_files_only=True)


@dataclass
class Endpoint:
    """One job's endpoint: its session, the URL it is served at, its token, and every backend call it made."""

    session: ExternalAgentSession
    url: str
    key: str
    served: list[Served] = field(default_factory=list)

    def renderer(self, tokenizer: Any, tools: list[dict[str, Any]] | None = TOOLS) -> ChatRenderer:
        return renderer_for(tokenizer, tools)


def renderer_for(tokenizer: Any, tools: list[dict[str, Any]] | None) -> ChatRenderer:
    """The renderer a session builds for a conversation with `tools` (hermes, the default parser)."""
    return ChatRenderer(tokenizer, tools, tool_instructions_json(tools or [], get_parser("hermes").call_format))


@pytest.fixture()
def job_sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    """The job's real sandbox, whose tools the session runs (bubblewrap when it can run here)."""
    with running_sandbox(tmp_path, prefix="ext-") as box:
        yield box


def serve(
    tokenizer: Any,
    backend_url: str,
    model: str,
    sandbox: Sandbox | None,
    job_id: str = JOB,
    sampling: Sampling | None = None,
    max_conversations: int = 32,
    **config: Any,
) -> Iterator[Endpoint]:
    """A session on `backend_url` (every call kept as Served; streamed calls streamed from the backend), served over
    HTTP as the rollout stage serves it."""
    client = LLMClient(request_timeout_s=300, max_retries=0)
    served: list[Served] = []

    def generate(prompt: list[int], sampling: Sampling, on_tokens: TokenSink | None = None) -> Completion:
        if on_tokens is None:
            completion = client.complete(backend_url, prompt, sampling, model)
        else:
            completion = client.stream(backend_url, prompt, sampling, on_tokens, model)
        served.append(Served(prompt, completion.token_ids, completion.logprobs, sampling.max_tokens))
        return completion

    def run_tool(name: str, args: dict[str, Any], timeout: float | None) -> Any:
        assert sandbox is not None
        return sandbox.call(name, args, timeout)

    defaults = {"max_turns": 8, "max_context_tokens": 4000, "max_tokens_per_turn": 32, "allowed_tools": DEFAULT_TOOLS}
    session = ExternalAgentSession(
        tokenizer,
        get_parser("hermes"),
        generate,
        run_tool,
        LoopConfig(**{**defaults, **config}),
        sampling or Sampling(max_tokens=32, temperature=1.0, seed=7),
        model,
        max_conversations=max_conversations,
        generate_stream=generate,
    )
    task = {"messages": TASK, "tools": TOOLS, "model": model}
    server = endpoint_server(build_app(session, job_id, SECRET, lambda: task), "127.0.0.1").start()
    yield Endpoint(session, server.url, job_token(SECRET, job_id), served)
    server.stop()
    client.close()
