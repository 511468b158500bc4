"""The project's own exceptions: one root, and one shape for refused input (where, and why).

`except RolloutsError` catches what the service raises on purpose and nothing else. Each class
under it keeps its built-in base too (ValueError, RuntimeError), so code that catches those still
works. Standard library only: everything from the API to the stage workers imports this.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

Loc = tuple[str | int, ...]

# What pydantic puts in front of a validator's own message: noise to a client, which sees the field.
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


class RolloutsError(Exception):
    """The root of the project's exceptions."""


class ValidationError(RolloutsError, ValueError):
    """Input refused before anything is stored: `loc` says where (("body", 3, "task", "kind")), `message` why.

    One exception may stand for several problems (`errors`), so that a request with many bad fields
    is answered once, naming all of them, as pydantic does. `str()` is "field: message".
    """

    def __init__(self, message: str, loc: Loc | str = (), *, errors: Sequence[ValidationError] = ()) -> None:
        self.message = message
        self.loc: Loc = (loc,) if isinstance(loc, str) else tuple(loc)
        self._parts = tuple(errors)
        super().__init__(self._describe())

    @property
    def field(self) -> str:
        """`loc` as a path a person reads: `body[3].task.kind`."""
        return format_loc(self.loc)

    @property
    def errors(self) -> tuple[ValidationError, ...]:
        """Every problem this exception stands for (itself, when it is one)."""
        return self._parts or (self,)

    def within(self, *prefix: str | int) -> ValidationError:
        """The same problem(s) seen from further out: `prefix` goes in front of every location."""
        if not prefix:
            return self
        moved = copy.copy(self)
        moved.loc = (*prefix, *self.loc)
        moved._parts = tuple(part.within(*prefix) for part in self._parts)
        moved.args = (moved._describe(),)
        return moved

    @classmethod
    def combine(cls, errors: Iterable[ValidationError]) -> ValidationError:
        """One exception for several problems; each keeps its own class, location and message."""
        parts = tuple(part for error in errors for part in error.errors)
        if len(parts) == 1:
            return parts[0]
        if not parts:
            raise ValueError("nothing to combine")
        return ValidationError("; ".join(str(part) for part in parts), errors=parts)

    @classmethod
    def from_pydantic(cls, source: Any, loc: Loc = ()) -> ValidationError:
        """pydantic's errors (its ValidationError, or its `errors()` list) under `loc`, in this shape.

        Takes them duck-typed so that this module needs no pydantic."""
        raw: Iterable[Mapping[str, Any]] = source.errors() if callable(getattr(source, "errors", None)) else source
        found = [ValidationError(_pydantic_message(e), (*loc, *e.get("loc", ()))) for e in raw]
        return cls.combine(found) if found else ValidationError("invalid", loc)

    def _describe(self) -> str:
        field = self.field
        return f"{field}: {self.message}" if field and not self._parts else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its state, not by calling __init__ again: subclasses take other arguments,
        # and copies (`within`) and pickles (an rq failure) must keep class, location and message.
        return (_restore, (type(self), self.args, self.__dict__.copy()))


def _restore(cls: type[ValidationError], args: tuple[Any, ...], state: dict[str, Any]) -> ValidationError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class NotPermitted(ValidationError):
    """Input that is well formed but not this caller's to give (an execution setting from a non-admin): a 403."""


def format_loc(loc: Iterable[str | int]) -> str:
    """("body", 3, "task", "kind") -> "body[3].task.kind"; strings already holding a path pass through."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _pydantic_message(error: Mapping[str, Any]) -> str:
    message = str(error.get("msg", "invalid"))
    for prefix in _PYDANTIC_PREFIXES:
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


class JobInputError(RolloutsError, ValueError):
    """The job's own input cannot run (found only by a stage, e.g. once its prompt is rendered): the job fails at
    once under `error_type`, its own `error.type`, so a trainer tells it from an infrastructure failure and
    does not retry it (it would fail again)."""

    error_type: ClassVar[str] = "invalid_input"


class ResultsUnavailable(RolloutsError, OSError):
    """The results store cannot take a result (directory missing, unwritable or full): an
    infrastructure failure, so the job fails with it rather than losing its result in silence."""


class StoredResultError(RolloutsError, RuntimeError):
    """A finished job's stored result cannot be read back; names the job and the file."""

    def __init__(self, job_id: str, path: str, problem: str) -> None:
        self.job_id = job_id
        self.path = path
        self.problem = problem
        super().__init__(f"job {job_id}: stored result {path} {problem}")


class StoredResultGone(StoredResultError):
    """The file is not there (removed by the retention sweep, or by hand)."""


class StoredResultCorrupt(StoredResultError):
    """The file is there but does not decode (truncated, overwritten, not ours)."""
