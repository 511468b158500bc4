"""A per-sandbox disk quota that holds rootless: the worker measures what the sandbox wrote and
ends it when it is over.

A hard per-directory quota needs the kernel's help (XFS project quotas, a loop-mounted image),
which an unprivileged worker cannot set up, and a size-capped tmpfs would be RAM. So the worker
walks the sandbox's writable trees (its workspace and its disk-backed /tmp) from a thread of its
own while a sandbox process runs, and kills the sandbox's process tree once they hold more than
``sandbox_disk_bytes`` (bytes on disk) or ``sandbox_disk_files`` (entries). The walk runs outside
the sandbox, so the policy cannot stop it; between two walks a writer can overshoot by what it
writes in one interval, each file still capped by RLIMIT_FSIZE. A walk costs time in proportion
to the tree's entries, so the watch paces itself: it waits at least ``WALK_PACING`` times as long
as its last walk took, which keeps one sandbox's walking under a tenth of a core on a big tree.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("rollouts.sandbox.quota")

WALK_PACING = 9.0  # wait >= 9 x the last walk: walking takes at most ~10% of a core


@dataclass(frozen=True)
class DiskUsage:
    """What the trees hold: bytes allocated on disk (hard links once) and entries."""

    bytes: int
    files: int


@dataclass(frozen=True)
class DiskQuota:
    """The bound on one sandbox's writable trees."""

    max_bytes: int
    max_files: int

    def exceeded(self, usage: DiskUsage) -> str | None:
        """Why ``usage`` is over the quota, or None."""
        if usage.bytes > self.max_bytes:
            quota = f"the sandbox's disk quota of {self.max_bytes} (sandbox_disk_bytes)"
            return f"{usage.bytes} bytes on disk, over {quota}"
        if usage.files > self.max_files:
            return f"{usage.files} files, over the sandbox's quota of {self.max_files} (sandbox_disk_files)"
        return None


def disk_usage(roots: Iterable[Path]) -> DiskUsage:
    """Walk the trees without following symlinks; sparse files count what they allocate.

    A directory the sandbox made unreadable (``chmod 000``, its own files when rootless) is given
    its owner's rwx back so nothing can be hidden from the count.
    """
    seen: set[tuple[int, int]] = set()
    total = files = 0
    stack = [Path(root) for root in roots]
    while stack:
        directory = stack.pop()
        for entry in _entries(directory):
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed while we walked
            files += 1
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
            if stat.S_ISDIR(info.st_mode):
                stack.append(Path(entry.path))
    return DiskUsage(bytes=total, files=files)


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except PermissionError:
        try:
            os.chmod(directory, stat.S_IMODE(os.lstat(directory).st_mode) | stat.S_IRWXU, follow_symlinks=False)
            with os.scandir(directory) as it:
                return list(it)
        except OSError as exc:
            raise QuotaUnmeasurable(f"cannot measure {directory}: {exc}") from exc
    except (FileNotFoundError, NotADirectoryError):
        return []


class QuotaUnmeasurable(OSError):
    """A tree the worker cannot walk: treated as over the quota, since it cannot be bounded."""


class QuotaWatch:
    """A thread that measures ``roots`` every ``interval_s`` and calls ``on_exceeded`` once."""

    def __init__(
        self,
        roots: list[Path],
        quota: DiskQuota,
        interval_s: float,
        on_exceeded: Callable[[str], None],
    ) -> None:
        self.roots = roots
        self.quota = quota
        self.interval_s = interval_s
        self.on_exceeded = on_exceeded
        self.reason: str | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sandbox-disk-quota", daemon=True)

    def check(self) -> str | None:
        """Measure now; the reason the quota is exceeded, or None."""
        try:
            reason = self.quota.exceeded(disk_usage(self.roots))
        except QuotaUnmeasurable as exc:
            reason = str(exc)
        if reason is not None and self.reason is None:
            self.reason = reason
            log.warning("sandbox over its disk quota (%s): %s", ", ".join(map(str, self.roots)), reason)
            self.on_exceeded(reason)
        return reason

    def start(self) -> QuotaWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        wait = self.interval_s
        while not self._stopped.wait(wait):
            started = time.monotonic()
            if self.check() is not None:
                return
            wait = max(self.interval_s, WALK_PACING * (time.monotonic() - started))
