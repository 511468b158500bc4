"""Checks of a task's fields that the built-in kinds share; each error names the field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from shared.tasks.base import TaskValidationError


def require_str(task: dict[str, Any], field: str) -> str:
    value = task.get(field)
    if not isinstance(value, str) or not value.strip():
        raise TaskValidationError(f"task.{field}: required, a non-empty string")
    return value


def optional_number(task: dict[str, Any], field: str, low: float, high: float) -> None:
    value = task.get(field)
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise TaskValidationError(f"task.{field}: a number between {low:g} and {high:g}")


def relative_path(task: dict[str, Any], field: str, default: str) -> str:
    """A workspace-relative file path that cannot climb out of the workspace."""
    value = task.get(field, default)
    if not isinstance(value, str) or not value or os.path.isabs(value) or ".." in Path(value).parts:
        raise TaskValidationError(f"task.{field}: a relative path inside the workspace")
    return value
