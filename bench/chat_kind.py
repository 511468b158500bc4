"""`bench-chat`: a multi-turn agent task with no sandbox, for benchmarks of the service in front of vLLM.

Loaded by workers through ROLLOUTS_TASK_MODULES=bench.chat_kind. The agent has only the finish
tool and is nudged after every turn without a tool call, so an episode is `max_turns` LLM turns
whose prompts grow by each reply and a nudge: the shape of an agent rollout, with the sandbox
left out so that what is measured is the service's own cost beside vLLM's. The reward is 0.
"""

from __future__ import annotations

from typing import Any

from shared.tasks import StageContext, register
from workers.kinds.agentic import AgentTask

SYSTEM = "Think step by step, then call finish with your answer."


def bench_messages(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation both sides of the benchmark start from."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]}]


@register
class BenchChatKind(AgentTask):
    name = "bench-chat"
    tools = ("finish",)

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return bench_messages(task)

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        return {"reward": 0.0}
