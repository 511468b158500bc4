"""The registry of task kinds: built-ins plus whatever modules the deployment names."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from shared.tasks.base import TaskKind

_KINDS: dict[str, TaskKind] = {}
_BUILTIN_MODULES = (
    "shared.tasks.demo",
    "shared.tasks.math_kind",
    "shared.tasks.stem_kind",
    "shared.tasks.code_kind",
    "shared.tasks.swe_kind",
)


def register(cls: type[TaskKind]) -> type[TaskKind]:
    """Class decorator: make a task kind available under `cls.name`."""
    _KINDS[cls.name] = cls()
    return cls


def get_kind(name: str) -> TaskKind:
    try:
        return _KINDS[name]
    except KeyError:
        raise KeyError(f"unknown task kind {name!r}; known kinds: {', '.join(known_kinds())}") from None


def known_kinds() -> list[str]:
    return sorted(_KINDS)


def load_task_modules(extra: Iterable[str] = ()) -> None:
    """Import the built-in kinds and the deployment's own (ROLLOUTS_TASK_MODULES); idempotent."""
    for module in (*_BUILTIN_MODULES, *extra):
        importlib.import_module(module)
