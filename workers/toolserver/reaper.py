"""Keep the sandbox's daemons in the tool server's tree, reap them, and kill them at the end.

The tool server makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a
process the agent daemonises (``setsid``, a double fork, ``nohup ... &``) is
re-parented to the tool server instead of the host's init when its parent
exits. Under bwrap the pid namespace already bounds the tree; in the
unisolated fallback this is what keeps such orphans reachable, so the
sandbox's stop (a walk of the server's descendants) and the server's own
shutdown kill them, instead of leaking them onto the node.

Orphans that exit become zombies of the tool server, so a thread reaps them,
by pid, and never the server's own children (the shell, the kernel fork server):
their owners (ptyprocess, ``subprocess.Popen``) wait for those themselves.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("rollouts.toolserver.reaper")

PR_SET_CHILD_SUBREAPER = 36
REAP_INTERVAL_S = 2.0


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux >= 3.4)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("cannot become a child subreaper (daemonised processes may outlive the sandbox): %s", exc)
        return False
    return True


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22), or None once it is gone or
    dead (a zombie): with the pid, what names one process even after its pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def kept_state(pid: int) -> tuple[int, str, str] | None:
    """(start ticks, limits, nice) of ``pid``, or None once it is gone, dead or stopped: what names a process
    kept from job to job, and what a process of the same user could have changed of it (its limits and its
    priority, which every process it forks inherits)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        limits = Path(f"/proc/{pid}/limits").read_text()
    except (OSError, IndexError):
        return None
    if stat[0] in ("T", "t", "Z", "X"):  # stopped (a job can SIGSTOP it) or dead
        return None
    return int(stat[19]), limits, stat[16]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process: not gone, not a zombie waiting to be reaped."""
    info = _stat(pid)
    return info is not None and info[0] not in ("Z", "X")


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from its threads' ``children`` lists, else a /proc scan)."""
    found: set[int] = set()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        for tid in tids:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found.update(int(c) for c in handle.read().split())
        return sorted(found)
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{pid}"):
            return []
    except OSError:
        pass
    for entry in os.listdir("/proc"):  # kernels without CONFIG_PROC_CHILDREN
        if entry.isdigit():
            info = _stat(int(entry))
            if info is not None and info[1] == pid:
                found.add(int(entry))
    return sorted(found)


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root``, parents before children."""
    found, queue = [], [root]
    while queue:
        for child in children(queue.pop(0)):
            found.append(child)
            queue.append(child)
    return found


def kill_descendants(root: int, exclude: Iterable[int] = (), rounds: int = 3) -> None:
    """SIGKILL ``root``'s descendants except the pids in ``exclude``, then reap ours.

    The one process-tree killer: the tool server's shutdown and the sandbox's stop both use it.
    """
    skip = set(exclude)
    for _ in range(rounds):
        tree = [pid for pid in descendants(root) if pid not in skip]
        if not tree:
            break
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    if root == os.getpid():
        reap_orphans(skip)


def reap_orphans(managed: Iterable[int]) -> int:
    """Reap exited children of this process that nothing else waits for; how many."""
    keep = set(managed)
    reaped = 0
    for pid in children(os.getpid()):
        if pid in keep:
            continue
        info = _stat(pid)
        if info is None or info[0] != "Z":
            continue
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped += 1
        except ChildProcessError:
            pass
    return reaped


class OrphanReaper:
    """A daemon thread that reaps exited orphans every few seconds until stopped."""

    def __init__(self, managed: Callable[[], Iterable[int]], interval_s: float = REAP_INTERVAL_S) -> None:
        self.managed = managed
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orphan-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                reap_orphans(self.managed())
            except Exception:  # the reaper must not take the server down
                log.exception("reaping orphans failed")
