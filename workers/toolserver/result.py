"""What one tool call returns to the agent loop."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class ToolResult:
    """The observation of one tool call.

    ``output`` is the text the agent sees. ``is_error`` marks a failed call (bad
    arguments, unknown tool, a path outside the workspace, a Python exception),
    never an exception in the worker. ``exit_code`` is bash's exact status (None
    for other tools). ``truncated`` says the output was cut to the cap, and
    ``finished`` that the agent called ``finish``.
    """

    output: str
    is_error: bool = False
    exit_code: int | None = None
    truncated: bool = False
    timed_out: bool = False
    finished: bool = False
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def error(cls, message: str) -> ToolResult:
        return cls(output=message, is_error=True)
