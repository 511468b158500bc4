"""A batch's statuses: running until its target is met (completed), its prompts cannot meet it
(exhausted), or it is cancelled. The batch Lua scripts write and compare the same words; a test
holds them to these."""

from __future__ import annotations

from shared.words import Word


class BatchStatus(Word):
    RUNNING = "running"
    COMPLETED = "completed"
    EXHAUSTED = "exhausted"
    CANCELLED = "cancelled"
