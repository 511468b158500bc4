"""Which job, stage and backend a log line is about, without passing them to every log call.

The stage runner binds the job and stage for the duration of a stage (`bind`); code deeper
down (the agent loop, once it has a backend) may add to it. A handler filter copies the values
onto every record, so the JSON formatter emits them as fields and the text format shows them.
Context variables are per thread, so the slots of one worker process never mix them up.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

FIELDS = ("job_id", "stage", "backend")

# The default is read-only: a binding always sets a new mapping, never changes the one it read.
_context: ContextVar[Mapping[str, str]] = ContextVar("rollouts_log_context", default=MappingProxyType({}))


@contextmanager
def bind(**values: str | None) -> Iterator[None]:
    """Add `job_id`, `stage` or `backend` to every log record emitted inside the block (this thread)."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown log context fields {sorted(unknown)}; known: {FIELDS}")
    token = _context.set({**_context.get(), **{k: v for k, v in values.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current() -> dict[str, str]:
    return dict(_context.get())


class ContextFilter(logging.Filter):
    """Puts the bound context on each record (as attributes) and a ` [job=... stage=...]` text suffix."""

    def filter(self, record: logging.LogRecord) -> bool:
        values = _context.get()
        for name in FIELDS:
            if name in values and not hasattr(record, name):
                setattr(record, name, values[name])
        shown = [f"{name.removesuffix('_id')}={getattr(record, name)}" for name in FIELDS if hasattr(record, name)]
        record.context = f" [{' '.join(shown)}]" if shown else ""
        return True
