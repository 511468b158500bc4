"""A task kind for bench.redis_memory: no model, no sandbox, a trajectory of realistic size and shape.

The rollout builds a real `Trajectory` (shared/trajectory.py) of `task.tokens` tokens: a prompt,
then assistant turns (token ids, logprobs, text) alternating with tool observations, from random
tokens seeded by the job id, so it compresses like real token data does, not like a repeated one.
"""

from __future__ import annotations

import random
import string
from typing import Any

from shared.tasks import StageContext, TaskKind, register
from shared.trajectory import ASSISTANT, OBSERVATION, PROMPT, Trajectory, Turn

VOCAB = 151_000  # a Qwen-sized vocabulary
CHARS_PER_TOKEN = 4


def _text(rng: random.Random, tokens: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(tokens * CHARS_PER_TOKEN))


def synthetic_trajectory(seed: str, tokens: int, prompt: int = 512, turn: int = 400) -> dict[str, Any]:
    """A valid trajectory of `tokens` tokens; assistant and observation turns of about `turn` tokens."""
    rng = random.Random(seed)
    trajectory = Trajectory()
    trajectory.append(Turn(role=PROMPT, start=0, end=0, text=_text(rng, prompt)), rng.choices(range(VOCAB), k=prompt))
    role = ASSISTANT
    while len(trajectory.token_ids) < tokens:
        n = min(turn, tokens - len(trajectory.token_ids))
        ids = rng.choices(range(VOCAB), k=n)
        if role == ASSISTANT:
            logprobs = [-rng.expovariate(2.0) for _ in range(n)]
            trajectory.append(Turn(role=ASSISTANT, start=0, end=0, text=_text(rng, n), model="bench"), ids, logprobs)
            role = OBSERVATION
        else:
            trajectory.append(Turn(role=OBSERVATION, start=0, end=0, text=_text(rng, n)), ids)
            role = ASSISTANT
    trajectory.stop_reason = "context_length"
    trajectory.validate()
    return trajectory.to_dict()


@register
class SyntheticTrajectoryKind(TaskKind):
    name = "synthetic-trajectory"

    def init(self, ctx: StageContext) -> dict[str, Any]:
        return {}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        return synthetic_trajectory(ctx.job_id, int(ctx.task.get("tokens", 8192)))

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        return {"reward": 1.0, "answer": None, "details": "synthetic: nothing graded"}
