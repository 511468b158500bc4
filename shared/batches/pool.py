"""Read and check a batch's prompt pool: inline items or a JSONL file the server can read.

Every item is checked before anything is stored (its shape, and its task by
its kind's own validate), so a batch never starts with a prompt that would
fail every sample; each problem names the item (`prompts[3].task` or
`prompts_path:12`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from shared.batches.spec import BatchRequest, PoolItem, normalise_pool_item
from shared.tasks import TaskValidationError, get_kind

MAX_POOL = 1_000_000
MAX_PROBLEMS = 20
MAX_FILE_BYTES = 256 * 1024 * 1024  # the default of ROLLOUTS_PROMPT_FILE_MAX_BYTES


def load_pool(
    request: BatchRequest, files_root: Path | None = None, max_file_bytes: int = MAX_FILE_BYTES
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(pool items as plain dicts, problems as {field, message}); nothing is usable unless problems is empty.

    `files_root` (ROLLOUTS_PROMPT_FILES_ROOT), when set, is the only tree `prompts_path` may name;
    it must be a regular file (never a FIFO, which would block, or a device such as /dev/zero, which
    never ends) of at most `max_file_bytes` (ROLLOUTS_PROMPT_FILE_MAX_BYTES).
    """
    if request.prompts is not None:
        raw = [(f"body.prompts[{i}]", item) for i, item in enumerate(request.prompts)]
    else:
        raw, problem = _read_jsonl(Path(request.prompts_path or ""), files_root, max_file_bytes)
        if problem:
            return [], [problem]
    if len(raw) > MAX_POOL:
        return [], [{"field": "body.prompts", "message": f"{len(raw)} prompts; the limit is {MAX_POOL}"}]
    items: list[dict[str, Any]] = []
    problems: list[dict[str, str]] = []
    for where, item in raw:
        checked = _check(where, item)
        if isinstance(checked, str):
            problems.append({"field": where, "message": checked})
            if len(problems) >= MAX_PROBLEMS:
                break
        else:
            items.append(checked)
    return items, problems


def _read_jsonl(
    path: Path, files_root: Path | None, max_bytes: int = MAX_FILE_BYTES
) -> tuple[list[tuple[str, Any]], dict[str, str] | None]:
    field = "body.prompts_path"
    if not path.is_absolute():
        return [], {"field": field, "message": "must be an absolute path on the server"}
    if files_root is not None and not path.resolve().is_relative_to(files_root.resolve()):
        return [], {"field": field, "message": f"must be inside {files_root} (ROLLOUTS_PROMPT_FILES_ROOT)"}
    try:
        text = _read_regular(path, max_bytes)
    except OSError as exc:
        return [], {"field": field, "message": f"cannot read {path}: {exc.strerror or type(exc).__name__}"}
    except ValueError as exc:
        return [], {"field": field, "message": str(exc)}
    raw: list[tuple[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw.append((f"{field}:{number}", orjson.loads(line)))
        except orjson.JSONDecodeError:
            return [], {"field": f"{field}:{number}", "message": "not valid JSON"}
    if not raw:
        return [], {"field": field, "message": f"{path} holds no prompts"}
    return raw, None


def _read_regular(path: Path, max_bytes: int) -> bytes:
    """The whole file, opened without blocking; ValueError if it is not a regular file or too large."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if info.st_size > max_bytes:
            limit = f"the limit is {max_bytes} (ROLLOUTS_PROMPT_FILE_MAX_BYTES)"
            raise ValueError(f"{path} is {info.st_size} bytes; {limit}")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise ValueError(f"{path} is over {max_bytes} bytes (ROLLOUTS_PROMPT_FILE_MAX_BYTES)")
    return data


def _check(where: str, item: Any) -> dict[str, Any] | str:
    """The item as stored, or why it is refused."""
    try:
        parsed = PoolItem.model_validate(normalise_pool_item(item))
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in first.get("loc", ()))
        return f"{path}: {first.get('msg', 'invalid')}" if path else first.get("msg", "invalid")
    kind = parsed.task.get("kind")
    if not isinstance(kind, str) or not kind:
        return "task.kind is required and must be a non-empty string"
    try:
        get_kind(kind).validate(parsed.task)
    except KeyError as exc:
        return f"task.kind: {exc.args[0]}"
    except TaskValidationError as exc:
        return f"task: {exc}"
    stored: dict[str, Any] = {"task": parsed.task, "metadata": parsed.metadata}
    for name in ("sampling", "limits"):
        value = getattr(parsed, name)
        if value is not None:
            stored[name] = value.model_dump(mode="json")
    return stored
