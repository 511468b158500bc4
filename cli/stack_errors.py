"""The local stack's one error: a process it starts did not come up (or a backend it registers is not usable)."""

from __future__ import annotations

from shared.errors import RolloutsError


class StackError(RolloutsError, RuntimeError):
    pass
