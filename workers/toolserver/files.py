"""File tools (view, create, str_replace) confined to the workspace.

Every path is resolved with symlinks followed and must land inside the
workspace root; reads open with O_NOFOLLOW so a symlink swapped in after the
check is refused rather than followed, and writes rename a new file over the
path, which replaces a symlink instead of following it (and leaves the old file
whole when the write fails). Opens are non-blocking and must
land on a regular file, so a FIFO (or a device) can neither hang the call
while it holds the files lock nor be read or written as a file. Edits decode
the file strictly: a file that is not UTF-8 is refused, never rewritten with
replacement characters.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from pathlib import Path


class ToolError(Exception):
    """A bad tool call: reported to the agent as an error observation."""


class Workspace:
    def __init__(self, root: Path, max_file_bytes: int = 10 * 1024 * 1024) -> None:
        self.root = Path(os.path.realpath(root))
        self.max_file_bytes = max_file_bytes

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` (relative to the root, or absolute inside it)."""
        if not isinstance(path, str) or not path or "\x00" in path:
            raise ToolError("path must be a non-empty string")
        candidate = Path(path) if os.path.isabs(path) else self.root / path
        real = Path(os.path.realpath(candidate))
        if real != self.root and self.root not in real.parents:
            raise ToolError(f"path {path!r} is outside the workspace {self.root}")
        return real

    @staticmethod
    def _open_regular(real: Path, flags: int, mode: int = 0o644) -> int:
        """Open without blocking (a FIFO would block forever) and insist on a regular file."""
        fd = os.open(real, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ToolError(f"{real} is not a regular file")
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read(self, real: Path, strict: bool = False) -> str:
        """The file's text; ``strict`` (for edits) refuses a file that is not UTF-8."""
        try:
            fd = self._open_regular(real, os.O_RDONLY)
        except FileNotFoundError:
            raise ToolError(f"{real} does not exist") from None
        except OSError as exc:
            raise ToolError(f"cannot open {real}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(self.max_file_bytes + 1)
        if len(data) > self.max_file_bytes:
            raise ToolError(f"{real} is larger than {self.max_file_bytes} bytes")
        if not strict:
            return data.decode("utf-8", errors="replace")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolError(f"{real} is not valid UTF-8 (byte {exc.start}); edit it with bash instead") from None

    def _write(self, real: Path, text: str) -> None:
        real.parent.mkdir(parents=True, exist_ok=True)
        if self.resolve(str(real.parent)) != real.parent:
            raise ToolError(f"parent of {real} moved outside the workspace")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError("the text is not valid UTF-8 (it contains a lone surrogate)") from None
        # Write a sibling and rename it over the file: a write that fails halfway (a full disk,
        # the file-size limit) leaves the old file as it was instead of truncated.
        try:
            mode = self._regular_mode(real)
            fd, staging = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
        except OSError as exc:
            raise ToolError(f"cannot write {real}: {exc.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(staging, mode)
            os.replace(staging, real)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(staging)
            raise ToolError(f"cannot write {real}: {exc.strerror}; the file is unchanged") from None

    @staticmethod
    def _regular_mode(real: Path) -> int:
        """The permission bits to keep (0o644 for a new file); refuses to replace anything but a regular file."""
        try:
            info = os.lstat(real)
        except FileNotFoundError:
            return 0o644
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{real} is not a regular file")
        return stat.S_IMODE(info.st_mode)

    def view(self, path: str, view_range: list[int] | None = None) -> str:
        real = self.resolve(path)
        if real.is_dir():
            entries = sorted(
                str(p.relative_to(real)) + ("/" if p.is_dir() else "")
                for p in real.iterdir()
                if not p.name.startswith(".")
            )
            return f"Directory {real}:\n" + "\n".join(entries) + ("\n" if entries else "")
        lines = self._read(real).splitlines()
        start, end = 1, len(lines)
        if view_range is not None:
            if (
                not isinstance(view_range, (list, tuple))
                or len(view_range) != 2
                or not all(isinstance(v, int) for v in view_range)
            ):
                raise ToolError("view_range must be [start, end] (1-based, end -1 for the last line)")
            start, end = view_range[0], (len(lines) if view_range[1] == -1 else view_range[1])
            if start < 1 or start > max(len(lines), 1) or end < start:
                raise ToolError(f"view_range {view_range} is invalid for a file of {len(lines)} lines")
            end = min(end, len(lines))
        width = len(str(end))
        body = "".join(f"{n:>{width}}\t{lines[n - 1]}\n" for n in range(start, end + 1))
        return f"{real} (lines {start}-{end} of {len(lines)}):\n{body}"

    def create(self, path: str, file_text: str) -> str:
        if not isinstance(file_text, str):
            raise ToolError("file_text must be a string")
        real = self.resolve(path)
        if real.is_dir():
            raise ToolError(f"{real} is a directory")
        existed = real.exists()
        self._write(real, file_text)
        return f"{'Overwrote' if existed else 'Created'} {real} ({len(file_text)} characters)"

    def str_replace(self, path: str, old_str: str, new_str: str = "") -> str:
        if not isinstance(old_str, str) or not old_str or not isinstance(new_str, str):
            raise ToolError("old_str must be a non-empty string and new_str a string")
        real = self.resolve(path)
        text = self._read(real, strict=True)
        count = text.count(old_str)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times (it must be unique)"
            raise ToolError(f"old_str {where} in {real}")
        updated = text.replace(old_str, new_str, 1)
        self._write(real, updated)
        line = text[: text.index(old_str)].count("\n") + 1
        snippet = updated.splitlines()[max(line - 3, 0) : line + 2 + new_str.count("\n")]
        return f"Edited {real} at line {line}:\n" + "\n".join(snippet) + "\n"
