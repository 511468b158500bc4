"""Task kinds: a light spec (what a task holds, how it is checked) and the stage code over it (how to
build a job's state, run its rollout and evaluate it)."""

from shared.tasks.base import TaskKind, TaskSpec, TaskValidationError
from shared.tasks.context import InterruptReason, StageContext, StageInterrupted
from shared.tasks.registry import (
    UnknownKind,
    get_kind,
    get_spec,
    known_kinds,
    load_stage_code,
    load_task_modules,
    register,
)
from shared.tasks.validation import Access, validate_job

__all__ = [
    "Access",
    "InterruptReason",
    "StageContext",
    "StageInterrupted",
    "TaskKind",
    "TaskSpec",
    "TaskValidationError",
    "UnknownKind",
    "get_kind",
    "get_spec",
    "known_kinds",
    "load_stage_code",
    "load_task_modules",
    "register",
    "validate_job",
]
