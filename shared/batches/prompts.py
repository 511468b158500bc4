"""Read and check a batch's prompts: inline items or a JSONL file the server can read.

Every item is checked before anything is stored, as a job of its own is (validate_job: its
shape, its kind, the kind's own checks), so a batch never starts with a prompt that would fail
every sample; each problem names the item and the field (`body.prompts[3].task.kind`, or
`body.prompts_path:12.task.kind` for line 12 of the file).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import orjson

from shared.batches.spec import BatchRequest, PromptItem, normalise_prompt_item
from shared.errors import Loc, ValidationError
from shared.tasks import Access, validate_job
from shared.tasks.validation import ADMIN

MAX_POOL = 1_000_000
MAX_PROBLEMS = 20
MAX_FILE_BYTES = 256 * 1024 * 1024  # the default of ROLLOUTS_PROMPT_FILE_MAX_BYTES
# A prompt item is a job less what the batch decides itself (group, sample index, idempotency key).
_ITEM_FIELDS = frozenset(PromptItem.model_fields)


def load_prompts(
    request: BatchRequest,
    files_root: Path | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
    access: Access = ADMIN,
) -> list[dict[str, Any]]:
    """The prompt items as plain dicts, or a ValidationError naming (up to MAX_PROBLEMS) problems.

    `files_root` (ROLLOUTS_PROMPT_FILES_ROOT), when set, is the only tree `prompts_path` may name;
    it must be a regular file (never a FIFO, which would block, or a device such as /dev/zero, which
    never ends) of at most `max_file_bytes` (ROLLOUTS_PROMPT_FILE_MAX_BYTES).
    """
    if request.prompts is not None:
        raw: list[tuple[Loc, Any]] = [(("body", "prompts", i), item) for i, item in enumerate(request.prompts)]
    else:
        raw = _read_jsonl(Path(request.prompts_path or ""), files_root, max_file_bytes)
    if len(raw) > MAX_POOL:
        raise ValidationError(f"{len(raw)} prompts; the limit is {MAX_POOL}", ("body", "prompts"))
    items: list[dict[str, Any]] = []
    problems: list[ValidationError] = []
    for loc, item in raw:
        try:
            items.append(_check(loc, item, access))
        except ValidationError as exc:
            problems.append(exc)
            if sum(len(p.errors) for p in problems) >= MAX_PROBLEMS:
                break
    if problems:
        raise ValidationError.combine(problems)
    return items


def _read_jsonl(path: Path, files_root: Path | None, max_bytes: int = MAX_FILE_BYTES) -> list[tuple[Loc, Any]]:
    """(location, parsed line) per non-blank line; line n's location is `body.prompts_path:n`."""
    loc = ("body", "prompts_path")
    if not path.is_absolute():
        raise ValidationError("must be an absolute path on the server", loc)
    if files_root is not None and not path.resolve().is_relative_to(files_root.resolve()):
        raise ValidationError(f"must be inside {files_root} (ROLLOUTS_PROMPT_FILES_ROOT)", loc)
    try:
        text = _read_regular(path, max_bytes)
    except OSError as exc:
        raise ValidationError(f"cannot read {path}: {exc.strerror or type(exc).__name__}", loc) from None
    except ValueError as exc:
        raise ValidationError(str(exc), loc) from None
    raw: list[tuple[Loc, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = ("body", f"prompts_path:{number}")
        try:
            raw.append((where, orjson.loads(line)))
        except orjson.JSONDecodeError:
            raise ValidationError("not valid JSON", where) from None
    if not raw:
        raise ValidationError(f"{path} holds no prompts", loc)
    return raw


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


def _check(loc: Loc, item: Any, access: Access) -> dict[str, Any]:
    """The item as stored (its own sampling and limits only where it set them); ValidationError if refused."""
    item = normalise_prompt_item(item)
    if isinstance(item, dict):
        extra = [
            ValidationError("Extra inputs are not permitted", (*loc, str(name)))
            for name in item
            if name not in _ITEM_FIELDS
        ]
        if extra:
            raise ValidationError.combine(extra)
        # null stands for "the batch's", as an absent field does
        item = {name: value for name, value in item.items() if value is not None or name not in ("sampling", "limits")}
    job = validate_job(item, loc, access)
    stored: dict[str, Any] = {"task": job.task, "metadata": job.metadata}
    for name in ("sampling", "limits"):
        if name in job.model_fields_set:
            stored[name] = getattr(job, name).model_dump(mode="json")
    return stored
