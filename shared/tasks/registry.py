"""The registry of task kinds: the built-in specs plus whatever modules the deployment names.

Two halves per kind. Its spec (`TaskSpec`: fields, checks, published formats, tools) is loaded at
start-up by the API, the CLI and every worker: `load_task_modules` imports `shared.kinds` and the
deployment's ROLLOUTS_TASK_MODULES. Its stage code (`TaskKind`) is imported by workers alone,
through `get_kind`, from the "module:Class" the spec names in `stages`; so the API process loads
no stage code. A kind written as one TaskKind class is its own stage code.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable

from shared.errors import ValidationError
from shared.tasks.base import TaskKind, TaskSpec

_SPECS: dict[str, TaskSpec] = {}
_KINDS: dict[str, TaskKind] = {}
_KINDS_LOCK = threading.Lock()

# The built-in kinds' specs are loaded by name, as a deployment's own are.
_BUILTIN_MODULES = ("shared.kinds",)


def register(cls: type[TaskSpec]) -> type[TaskSpec]:
    """Class decorator: make a task kind available under `cls.name`.

    `cls` is a spec naming its stage code (`stages = "module:Class"`) or a whole kind in one
    TaskKind class; a spec that names no stage code could never run, so it is refused here.
    """
    if not issubclass(cls, TaskKind) and not cls.stages:
        raise TypeError(f"kind {cls.name!r}: a TaskSpec names its stage code in `stages` ('module:Class')")
    _SPECS[cls.name] = cls()
    _KINDS.pop(cls.name, None)
    return cls


class UnknownKind(ValidationError):
    """A task whose kind no loaded module registered: refused at task.kind, naming the kinds there are."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.kind = name
        self.known = known
        super().__init__(f"unknown task kind {name!r}; known kinds: {', '.join(known)}", ("task", "kind"))


def get_spec(name: str) -> TaskSpec:
    """The registered kind's spec; UnknownKind (a ValidationError, so a 422 at the API) for any other name."""
    try:
        return _SPECS[name]
    except KeyError:
        raise UnknownKind(name, known_kinds()) from None


def get_kind(name: str) -> TaskKind:
    """The kind's stage code, imported on first use (workers only: the API never calls this)."""
    spec = get_spec(name)
    if isinstance(spec, TaskKind):
        return spec
    with _KINDS_LOCK:
        kind = _KINDS.get(name)
        if kind is None:
            kind = _KINDS[name] = _load_stages(spec)
    return kind


def _load_stages(spec: TaskSpec) -> TaskKind:
    """Import the class `spec.stages` names; it must be a TaskKind subclass of the spec, under its name."""
    module, _, attribute = (spec.stages or "").partition(":")
    cls = getattr(importlib.import_module(module), attribute, None)
    if not (isinstance(cls, type) and issubclass(cls, TaskKind) and issubclass(cls, type(spec))):
        spec_class = type(spec).__name__
        raise TypeError(f"kind {spec.name!r}: stages {spec.stages!r} is not a TaskKind subclass of {spec_class}")
    if cls.name != spec.name:
        raise TypeError(f"kind {spec.name!r}: stages {spec.stages!r} is named {cls.name!r}")
    return cls()


def known_kinds() -> list[str]:
    return sorted(_SPECS)


def load_task_modules(extra: Iterable[str] = ()) -> None:
    """Import the built-in specs and the deployment's own kinds (ROLLOUTS_TASK_MODULES); idempotent."""
    for module in (*_BUILTIN_MODULES, *extra):
        importlib.import_module(module)


def load_stage_code() -> None:
    """Import every registered kind's stage code now (a worker at start-up), so a broken module fails
    the worker's start, not its first job."""
    for name in known_kinds():
        get_kind(name)
