"""A size-capped tmpfs over a directory, for the tests that fill a disk (workspaces, Redis' own)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(directory: Path, size_bytes: int) -> Iterator[Path]:
    """Mount a tmpfs of `size_bytes` over `directory` (made if missing) and yield it; always unmounted
    after. Skips the test where mounting is not allowed (not root, no mount namespace rights)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-capped tmpfs needs root")
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield directory
    finally:
        _unmount(directory)


def _unmount(directory: Path) -> None:
    """Unmount, lazily if a process still holds a file there (it goes when that process does)."""
    if subprocess.run(["umount", str(directory)], capture_output=True, check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)
