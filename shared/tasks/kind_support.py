"""Small pieces the built-in kinds share: field checks, the agent's PATH, safe reads of agent files."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

from shared.config import Settings
from shared.tasks.base import TaskValidationError
from shared.toolserver.files import ToolError, Workspace

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def agent_env(settings: Settings) -> dict[str, str]:
    """Environment for the agent's sandbox: with the local backend, this service's Python
    environment (bound read-only into the sandbox) comes first on PATH, so `python` and
    `python -m pytest` inside work as they do for the evaluator."""
    if settings.sandbox_backend != "local":
        return {}
    return {"PATH": f"{Path(sys.executable).parent}:{_SYSTEM_PATH}"}


def read_agent_file(workspace: Path, relative: str, max_bytes: int) -> str | None:
    """A file the agent wrote, read without following a symlink out of the workspace;
    None if it does not exist. Raises ValueError if it is unreadable, not a regular file (a FIFO
    would block the read forever, a device never end) or too large."""
    tree = Workspace(workspace, max_file_bytes=max_bytes)
    try:
        real = tree.resolve(relative)
    except ToolError as exc:
        raise ValueError(str(exc)) from None
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot open {relative}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ValueError(f"{relative} is {'a directory' if stat.S_ISDIR(mode) else 'not a regular file'}")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{relative} is larger than {max_bytes} bytes")
    return data.decode("utf-8", errors="replace")
