"""Process-level containment shared by the backends: rlimits and per-sandbox uids.

RLIMIT_NPROC is counted per real uid and not enforced at all for root, so a
fork bomb is only bounded if the sandbox runs as an unprivileged uid that no
other sandbox shares. When the worker runs as root, each live sandbox takes its
own uid from a pool (``sandbox_uid_base`` + slot), held by an flock on a
node-local lock file; as a normal user (HPC), the sandbox keeps the user's uid
and the limit counts that user's processes.
"""

from __future__ import annotations

import fcntl
import os
import random
import resource
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from workers.sandbox.spec import SandboxLimits

_LOCK_DIR = Path(tempfile.gettempdir()) / "rollouts-sandbox-uids"


def rlimit_preexec(limits: SandboxLimits) -> Callable[[], None]:
    """A ``preexec_fn`` that applies the limits in the child before it execs."""
    pairs = [
        (resource.RLIMIT_CPU, limits.cpu_seconds),
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        (resource.RLIMIT_CORE, 0),
    ]

    def apply() -> None:
        for kind, value in pairs:
            if value is None:
                continue
            _, hard = resource.getrlimit(kind)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)  # an unprivileged worker cannot raise its hard limit
            resource.setrlimit(kind, (value, value))

    return apply


class UidSlot:
    """An unprivileged uid reserved for one sandbox while the lock is held."""

    def __init__(self, uid: int, lock_fd: int) -> None:
        self.uid = uid
        self._fd: int | None = lock_fd
        self._lock = threading.Lock()

    @classmethod
    def acquire(cls, base: int, count: int) -> UidSlot:
        _LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        start = random.randrange(count)
        for step in range(count):
            uid = base + (start + step) % count
            fd = os.open(_LOCK_DIR / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(uid, fd)
        raise RuntimeError(f"all {count} sandbox uids from {base} are in use on this node")

    def release(self) -> None:
        """Drop the uid; idempotent and thread-safe (the fd is closed exactly once)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing drops the flock


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give a tree to the sandbox's uid without following symlinks out of it."""
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
