"""The token-exact trajectory record (token-in / token-out); schema in docs/TRAJECTORY.md.

Token IDs are the canonical record: the prompt and every turn exactly as the model saw
and produced them. Text is kept per turn only for people and evaluators. The invariants
a trainer relies on are checked by `Trajectory.validate()`:

- the turns' spans tile `token_ids` exactly (contiguous, in order, from 0 to the end);
- `loss_mask` is 1 exactly on the spans of assistant turns (model-generated tokens);
- `logprobs` has one entry per token: the backend's logprob on generated tokens, None elsewhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from shared.errors import RolloutsError

SCHEMA_VERSION = 1


def _own_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The entries of a stored record that are fields of the dataclass `cls` (others are dropped)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


# Turn roles: the initial prompt, a model generation, and the template/observation tokens between two generations.
PROMPT, ASSISTANT, OBSERVATION = "prompt", "assistant", "observation"
ROLES = (PROMPT, ASSISTANT, OBSERVATION)

# Why a trajectory ended.
STOP_REASONS = (
    "finish",  # the agent called the finish tool
    "no_tool_call",  # an assistant turn without a tool call (when that stops the loop)
    "max_turns",
    "context_length",  # no room left for another generation or the next observation
    "time_budget",  # the stage's time was nearly spent; stopped cleanly
    "cancelled",  # the job was cancelled (partial record only)
    "timed_out",  # the stage was cut off at its deadline (partial record only)
    "requeue",  # the worker shut down and handed the job back (partial record only)
    "superseded",
    "error",  # an infrastructure error ended it (partial record only; stop_detail says which)
    "new_segment",  # an external agent's next call did not extend this record: a new segment began (`segments`)
)


class TrajectoryError(RolloutsError, ValueError):
    """A record that breaks the token invariants: a bug upstream, never to be trained on."""


@dataclass
class ToolCallRecord:
    """One parsed tool call of an assistant turn and what running it returned."""

    name: str | None
    arguments: dict[str, Any] | None
    raw: str  # the text of the call as the model wrote it
    error: str | None = None  # why the call is malformed or was refused (then not run)
    output: str | None = None  # the observation text the agent got back
    is_error: bool = False
    exit_code: int | None = None
    truncated: bool = False
    timed_out: bool = False
    duration_s: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCallRecord:
        return cls(**_own_fields(cls, data))


@dataclass
class Turn:
    """One span of the token record. `start`/`end` index `token_ids` (end exclusive)."""

    role: str
    start: int
    end: int
    text: str  # decode(token_ids[start:end]), special tokens kept
    # assistant turns only
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    backend_id: str | None = None
    model: str | None = None  # the served model name the backend reported
    # The weight version vLLM reports for the turn's first token (its oldest), and every span of
    # it ([start, end) offsets into the turn's tokens) when an update landed mid-generation.
    policy_version: str | None = None
    weight_versions: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    latency_s: float | None = None
    cached_tokens: int | None = None
    # observation turns only: the chat messages these tokens render
    messages: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float | None = None  # tool time (observation turns)
    # external agents' assistant turns: the call's index among all the job's recorded calls (every
    # conversation), so the order of calls across conversations survives the split into segments
    call: int | None = None

    @property
    def length(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Turn:
        values = _own_fields(cls, data)
        values["tool_calls"] = [ToolCallRecord.from_dict(c) for c in data.get("tool_calls") or []]
        return cls(**values)


@dataclass
class Counts:
    turns: int = 0  # assistant turns
    tool_calls: int = 0  # parsed calls, malformed ones included
    tool_errors: int = 0  # calls that came back as errors (malformed, refused, or failed in the sandbox)
    malformed_tool_calls: int = 0
    generated_tokens: int = 0
    observation_tokens: int = 0  # template and tool output tokens after the prompt

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Counts:
        return cls(**_own_fields(cls, data))


@dataclass
class Trajectory:
    """The whole record of one rollout; `to_dict()` is what is stored (msgpack) and served."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    prompt_length: int = 0
    stop_reason: str | None = None
    stop_detail: str | None = None
    final_text: str = ""  # the last assistant turn's text, without its end-of-turn token
    answer: str | None = None  # the finish tool's answer argument, if it was called
    counts: Counts = field(default_factory=Counts)
    timings: dict[str, float] = field(default_factory=dict)  # llm_s, tools_s, total_s
    tokenizer: str | None = None  # name_or_path of the tokenizer that rendered the template tokens
    tool_parser: str | None = None
    # Where the rollout's sandbox came from: "pool" (taken ready from the worker's sandbox pool),
    # "started" (started for this job), None (no sandbox). The run page counts the pool's hits.
    sandbox: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the kind's collect() output
    # An external agent's earlier segments, oldest first, each a whole record of its own (to_dict());
    # this record is the last one. Empty for the built-in loop.
    segments: list[dict[str, Any]] = field(default_factory=list)
    # An external agent's conversation this segment belongs to (`c0`, `c1`, ... or the id the agent
    # named in `x-rollouts-conversation`); None for the built-in loop.
    conversation: str | None = None
    schema_version: int = SCHEMA_VERSION

    # --- building ---------------------------------------------------------------
    def append(self, turn: Turn, token_ids: list[int], logprobs: list[float] | None = None) -> Turn:
        """Append a span; assistant spans need their logprobs (one per token), other spans none."""
        if turn.role == ASSISTANT:
            if logprobs is None or len(logprobs) != len(token_ids):
                raise TrajectoryError("an assistant turn needs exactly one logprob per generated token")
        elif logprobs is not None:
            raise TrajectoryError(f"a {turn.role} turn carries no logprobs")
        turn.start, turn.end = len(self.token_ids), len(self.token_ids) + len(token_ids)
        self.token_ids.extend(token_ids)
        generated = turn.role == ASSISTANT
        self.loss_mask.extend([1 if generated else 0] * len(token_ids))
        self.logprobs.extend(logprobs if generated else [None] * len(token_ids))
        if turn.role == PROMPT:
            self.prompt_length = len(token_ids)
        elif generated:
            self.counts.turns += 1
            self.counts.generated_tokens += len(token_ids)
        else:
            self.counts.observation_tokens += len(token_ids)
        self.turns.append(turn)
        return turn

    # --- checking ---------------------------------------------------------------
    def validate(self) -> None:
        """Raise TrajectoryError unless spans, mask and logprobs line up with token_ids exactly."""
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise TrajectoryError(
                f"lengths differ: {n} tokens, {len(self.loss_mask)} mask, {len(self.logprobs)} logprobs"
            )
        position = 0
        for index, turn in enumerate(self.turns):
            if turn.role not in ROLES:
                raise TrajectoryError(f"turn {index}: unknown role {turn.role!r}")
            if turn.start != position or turn.end < turn.start:
                raise TrajectoryError(f"turn {index}: span [{turn.start}, {turn.end}) does not follow {position}")
            if (turn.role == PROMPT) != (index == 0):
                raise TrajectoryError("the prompt must be the first turn, and only the first")
            generated = turn.role == ASSISTANT
            for i in range(turn.start, turn.end):
                if self.loss_mask[i] != int(generated):
                    raise TrajectoryError(f"turn {index}: loss_mask[{i}] is {self.loss_mask[i]}")
                if generated != (self.logprobs[i] is not None):
                    raise TrajectoryError(f"turn {index}: logprobs[{i}] is {self.logprobs[i]!r}")
            position = turn.end
        if position != n:
            raise TrajectoryError(f"turns cover {position} of {n} tokens")
        if self.turns and self.prompt_length != self.turns[0].length:
            raise TrajectoryError("prompt_length differs from the prompt turn")
        if self.stop_reason is not None and self.stop_reason not in STOP_REASONS:
            raise TrajectoryError(f"unknown stop reason {self.stop_reason!r}")
        for segment in self.segments:
            Trajectory.from_dict(segment)  # each earlier segment keeps every invariant on its own

    # --- (de)serializing ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain types only (msgpack and JSON safe)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], validate: bool = True) -> Trajectory:
        values = _own_fields(cls, data)
        values["turns"] = [Turn.from_dict(t) for t in data.get("turns") or []]
        values["counts"] = Counts.from_dict(data.get("counts") or {})
        for key in ("token_ids", "loss_mask", "logprobs"):
            values[key] = list(data.get(key) or [])
        trajectory = cls(**values)
        if validate:
            trajectory.validate()
        return trajectory


def turn_versions(trajectory: dict[str, Any]) -> tuple[str, set[str | None]]:
    """The served model and every version that sampled an assistant token of a stored trajectory."""
    model, versions = "", set()
    for turn in trajectory.get("turns") or []:
        if turn.get("role") != ASSISTANT:
            continue
        model = model or str(turn.get("model") or "")
        spans = turn.get("weight_versions") or []
        versions |= {span.get("version") for span in spans} if spans else {turn.get("policy_version")}
    return model, versions
