"""Which record an external agent's call extends: the job's conversations, each a chain of segments.

A job may hold several conversations at once; each has one open segment (the record its next call
extends), and every segment the job opened is kept, in opening order, for the result. A call that
fails is taken back whole (`savepoint`, `undo`), so the agent's retry extends a record exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.trajectory import PROMPT, Trajectory, Turn
from workers.rollout.chat_delta import ChatRenderer
from workers.rollout.external_agent import wire


@dataclass
class Segment:
    """The open segment: its record, what it renders from, and the conversation it holds so far."""

    record: Trajectory
    renderer: ChatRenderer | None  # None for a text (/v1/completions) segment
    tools: list[dict[str, Any]] | None
    conversation: list[dict[str, Any]] = field(default_factory=list)  # the messages of its last call
    stop_text: str = ""  # the end-of-turn token text the model generated last

    def extended_by(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
        """Whether `messages` are this segment's last call's messages (with its answer) followed by new ones."""
        n = len(self.conversation)
        return (
            self.renderer is not None
            and (tools or None) == self.tools
            and n > 0
            and len(messages) > n
            and messages[:n] == self.conversation
        )


@dataclass
class Savepoint:
    """What a call may change, to take it back if its generation fails."""

    open: dict[str, Segment]
    segments: int
    turns: list[tuple[Segment, int]]


class Conversations:
    """Every segment of one job, in the order they opened, and each conversation's open one."""

    def __init__(self, max_conversations: int) -> None:
        self.max_conversations = max_conversations
        self.segments: list[Segment] = []  # every segment, in the order they opened
        self.open: dict[str, Segment] = {}  # each conversation's open segment, least recently called first
        self.last: Segment | None = None  # the segment of the last recorded call: the result's top record

    def candidates(self, named: str | None) -> list[Segment]:
        """The open segments a call may extend: the named conversation's, else all, most recently called first."""
        if named is not None:
            return [self.open[named]] if named in self.open else []
        return list(reversed(self.open.values()))

    def start(self, segment: Segment, token_ids: list[int], text: str, named: str | None) -> Segment:
        """Open `segment` with its prompt in the named conversation (closing its open segment as
        `new_segment`), else in a new one."""
        name = named if named is not None else self._new_conversation_id()
        if name not in self.open and len(self.open) >= self.max_conversations:
            raise wire.ExternalAgentError(
                409,
                f"this job already holds {len(self.open)} conversations, its limit "
                "(external_agent_max_conversations); continue one of them (x-rollouts-conversation names it)",
                None,
                "conflict",
            )
        earlier = self.open.get(name)
        if earlier is not None:
            earlier.record.stop_reason = "new_segment"
        segment.record.conversation = name
        segment.record.append(Turn(role=PROMPT, start=0, end=0, text=text), token_ids)
        self.open[name] = segment
        self.segments.append(segment)
        return segment

    def called(self, segment: Segment) -> None:
        """`segment` answered the last call: the result's top record, and tried first next time."""
        self.last = segment
        name = segment.record.conversation
        assert name is not None
        self.open[name] = self.open.pop(name)

    def _new_conversation_id(self) -> str:
        """`c0`, `c1`, ...: the first not taken (an agent may have named one so)."""
        taken = {s.record.conversation for s in self.segments}
        return next(f"c{i}" for i in range(len(taken) + 1) if f"c{i}" not in taken)

    # --- a call that fails leaves the records as they were ---------------------------------
    def savepoint(self) -> Savepoint:
        return Savepoint(dict(self.open), len(self.segments), [(s, len(s.record.turns)) for s in self.open.values()])

    def undo(self, savepoint: Savepoint) -> None:
        """Take back what a call added since `savepoint`: a new segment, or the observation it appended."""
        del self.segments[savepoint.segments :]  # a segment this call started: dropped
        for segment in savepoint.open.values():  # the one it closed (if any): open again
            segment.record.stop_reason = None
        self.open = savepoint.open
        for segment, turns in savepoint.turns:  # the observation it appended (if any): taken back
            record = segment.record
            if len(record.turns) == turns:
                continue
            dropped, end = record.turns[turns:], record.turns[turns].start
            del record.turns[turns:], record.token_ids[end:], record.loss_mask[end:], record.logprobs[end:]
            record.counts.observation_tokens -= sum(t.length for t in dropped)
