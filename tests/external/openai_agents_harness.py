"""An unmodified OpenAI Agents SDK agent with one function tool, run against a job's endpoint until the SDK ends it.

Run by the interpreter of the SDK's own environment (scripts/setup.sh test: openai-agents caps
websockets below the project's version), so it imports nothing of the project. The agent uses the
SDK's default model class (the Responses API) through the default client pointed at the endpoint.
Prints one JSON line: the final output, the model class the SDK used, its responses and tool calls.

    python openai_agents_harness.py BASE_URL API_KEY MODEL PROMPT [--stream] [--max-turns N] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

calls: list[dict[str, Any]] = []


@function_tool
def bash(command: str) -> str:
    """Run a bash command and return its output."""
    calls.append({"name": "bash", "command": command})
    return "a.txt\nb.txt"


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("base_url", "api_key", "model", "prompt"):
        parser.add_argument(name)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    set_tracing_disabled(True)  # no exporter: nothing leaves the machine
    set_default_openai_client(
        AsyncOpenAI(base_url=f"{args.base_url}/v1", api_key=args.api_key, max_retries=0), use_for_tracing=False
    )
    agent = Agent(
        name="harness",
        instructions="You are a careful assistant. Use bash to look around.",
        model=args.model,
        tools=[bash],
        model_settings=ModelSettings(max_tokens=args.max_tokens),
    )
    if args.stream:
        result: Any = Runner.run_streamed(agent, args.prompt, max_turns=args.max_turns)
        kinds = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in kinds, kinds
    else:
        result = await Runner.run(agent, args.prompt, max_turns=args.max_turns)
    print(
        json.dumps(
            {
                "final_output": result.final_output,
                "responses": [r.response_id for r in result.raw_responses],
                "tool_calls": calls,
                "model_class": _model_class(args.model),
            }
        )
    )


def _model_class(model: str) -> str:
    """The class the SDK's default provider builds for a model named by string (as the agent's was)."""
    from agents.models.multi_provider import MultiProvider

    return type(MultiProvider().get_model(model)).__name__


if __name__ == "__main__":
    asyncio.run(main())
