"""Task kinds: how to build a job's state, run its rollout and evaluate it."""

from shared.tasks.base import TaskKind, TaskValidationError
from shared.tasks.context import StageContext, StageInterrupted
from shared.tasks.registry import UnknownKind, get_kind, known_kinds, load_task_modules, register
from shared.tasks.validation import Access, validate_job

__all__ = [
    "Access",
    "StageContext",
    "StageInterrupted",
    "TaskKind",
    "TaskValidationError",
    "UnknownKind",
    "get_kind",
    "known_kinds",
    "load_task_modules",
    "register",
    "validate_job",
]
