"""What one generation asks for (`Sampling`) and what it gives back (`Completion`), and its turn in the record.

These are the client's words, whichever vLLM route served the call (llm_wire.py) and whether it was
streamed (llm_stream.py); the agent loop and the external agent's session record a completion the
one way `assistant_turn` does.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.trajectory import ASSISTANT, Turn


@dataclass(frozen=True)
class Sampling:
    """What the job means by sampling, in vLLM's ``SamplingParams`` names; every field is sent.

    The defaults are neutral (no penalties, top_k off, min_p off), not vLLM's generation_config.
    ``extra`` passes other SamplingParams fields through.
    """

    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables top-k
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_request(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "n": 1,
            "max_tokens": self.max_tokens,
            "min_tokens": 0,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": max(self.top_k, 0),
            "min_p": self.min_p,
            "seed": self.seed,
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": self.ignore_eos,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }
        body.update(self.extra)
        return body


@dataclass(frozen=True)
class WeightSpan:
    """Generated tokens ``[start, end)`` of a turn were sampled by the weights labelled ``version``."""

    version: str
    start: int
    end: int


@dataclass(frozen=True)
class Completion:
    """One turn's generation, exactly as the backend produced it."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None
    stop_reason: int | str | None
    model: str  # the served model name the backend reported
    backend_id: str
    prompt_tokens: int
    cached_tokens: int | None
    latency_s: float
    attempts: int
    weight_versions: tuple[WeightSpan, ...] = ()  # empty where the endpoint does not report them

    @property
    def policy_version(self) -> str | None:
        """The weight version of the turn's first token (the oldest, if an update landed mid-turn)."""
        return self.weight_versions[0].version if self.weight_versions else None

    def ends_on_stop_token(self, special_ids: Collection[int]) -> bool:
        """Did the turn end on an end-of-turn token (EOS or a stop token id) that is in token_ids?

        vLLM names a stop token id in stop_reason; EOS gives stop_reason None, so the last token
        is then checked against the tokenizer's special ids.
        """
        if self.finish_reason != "stop" or not self.token_ids:
            return False
        last = self.token_ids[-1]
        if isinstance(self.stop_reason, int):
            return last == self.stop_reason
        return self.stop_reason is None and last in special_ids


def assistant_turn(completion: Completion, text: str, call: int | None = None) -> Turn:
    """The assistant turn recording `completion` (its tokens go in with it: `Trajectory.append`), `text` decoded."""
    return Turn(
        role=ASSISTANT,
        start=0,
        end=0,
        text=text,
        backend_id=completion.backend_id,
        model=completion.model,
        policy_version=completion.policy_version,
        weight_versions=[asdict(span) for span in completion.weight_versions],
        finish_reason=completion.finish_reason,
        stop_reason=completion.stop_reason,
        latency_s=completion.latency_s,
        cached_tokens=completion.cached_tokens,
        call=call,
    )
