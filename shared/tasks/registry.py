"""The registry of task kinds: built-ins plus whatever modules the deployment names."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from shared.errors import ValidationError
from shared.tasks.base import TaskKind

_KINDS: dict[str, TaskKind] = {}

# The built-in kinds are loaded by name, as a deployment's own are: they live with the workers,
# above the stage libraries they call, and the API and the workers both load them at start-up.
_BUILTIN_MODULES = ("workers.kinds",)


def register(cls: type[TaskKind]) -> type[TaskKind]:
    """Class decorator: make a task kind available under `cls.name`."""
    _KINDS[cls.name] = cls()
    return cls


class UnknownKind(ValidationError):
    """A task whose kind no loaded module registered: refused at task.kind, naming the kinds there are."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.kind = name
        self.known = known
        super().__init__(f"unknown task kind {name!r}; known kinds: {', '.join(known)}", ("task", "kind"))


def get_kind(name: str) -> TaskKind:
    """The registered kind; UnknownKind (a ValidationError, so a 422 at the API) for any other name."""
    try:
        return _KINDS[name]
    except KeyError:
        raise UnknownKind(name, known_kinds()) from None


def known_kinds() -> list[str]:
    return sorted(_KINDS)


def load_task_modules(extra: Iterable[str] = ()) -> None:
    """Import the built-in kinds and the deployment's own (ROLLOUTS_TASK_MODULES); idempotent."""
    for module in (*_BUILTIN_MODULES, *extra):
        importlib.import_module(module)
