"""A sandbox's processes as the host sees them: spawned from one long-lived thread, killed as a whole tree.

What `Sandbox` (sandbox.py) needs of the host, whichever backend wraps the command: a launcher that
outlives the worker thread that started it, a teardown that leaves nothing running in the sandbox's
pid namespace, and a one-shot command's captured output read without reading it whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from workers.toolserver.output import CappedBuffer
from workers.toolserver.reaper import descendants, kill_descendants

log = logging.getLogger("rollouts.sandbox")

# bwrap --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that forked
# it exits, so every sandbox process is spawned from one long-lived thread per
# process: a sandbox started from a short-lived worker thread would otherwise die
# with it. Per process, because a forked child (rq's work horse) inherits the
# executor but not its thread.
_spawner: tuple[int, ThreadPoolExecutor] | None = None
_spawner_lock = threading.Lock()
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child should not dlopen


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **kwargs)`, from this process's spawner thread, the child dying with it."""
    global _spawner
    # A preexec_fn in a threaded process is safe only if it takes no lock: this one calls prctl and getppid.
    kwargs["preexec_fn"] = _die_with_worker(os.getpid(), kwargs.get("preexec_fn"))
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():
            _spawner = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner"))
        executor = _spawner[1]
    return executor.submit(subprocess.Popen, argv, **kwargs).result()


def _die_with_worker(worker: int, then: Callable[[], Any] | None) -> Callable[[], None]:
    """A ``preexec_fn`` arming SIGKILL for when the spawner thread (so, a SIGKILLed worker) dies.

    bwrap's ``--die-with-parent`` arms the same only once bwrap runs, after the shell that opens its
    seccomp filter (or the network launcher) has started: a worker killed in between left a sandbox
    with no parent to die with. Armed here, in the child before it execs, it holds from the fork on
    (kept across exec; bwrap and the launcher arm it again), and a child whose worker is already gone
    exits. It also ends the unisolated fallback's tool server with its worker."""

    def arm() -> None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != worker:  # the worker died before the signal was armed
            os._exit(1)
        if then is not None:
            then()

    return arm


def kill_group(proc: subprocess.Popen[bytes], launcher_reaps: bool = True) -> None:
    """SIGKILL the sandbox's own process tree and wait until it is gone.

    The launcher's descendants are found by parentage (never by name) and
    killed; with bwrap that includes its init in the sandbox's pid namespace, so
    the kernel kills everything in that namespace, and bwrap, which waits for
    its init, returns only once they are all reaped. Without a pid namespace
    (the unisolated fallback) the descendant walk is what reaches background
    jobs that bash put in process groups of their own, and the launcher (the
    tool server itself) does not exit on its own (``launcher_reaps`` False).
    """
    namespaces = _foreign_pid_namespaces(descendants(proc.pid))
    kill_descendants(proc.pid)
    if launcher_reaps:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()
    _wait_namespaces_empty(namespaces, timeout=5.0)


def _foreign_pid_namespaces(pids: list[int]) -> set[str]:
    """The pid namespaces (other than ours) these processes live in."""
    own = os.readlink("/proc/self/ns/pid")
    found = set()
    for pid in pids:
        try:
            found.add(os.readlink(f"/proc/{pid}/ns/pid"))
        except OSError:
            continue
    found.discard(own)
    return found


def _wait_namespaces_empty(namespaces: set[str], timeout: float) -> None:
    """Wait until no process is left in these pid namespaces (tasks still being torn down)."""
    deadline = time.monotonic() + timeout
    while namespaces and time.monotonic() < deadline:
        busy = False
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/ns/pid") in namespaces:
                        busy = True
                        break
                except OSError:
                    continue
        if not busy:
            return
        time.sleep(0.01)
    if namespaces:
        log.warning("processes still in pid namespace(s) %s after stop", ", ".join(sorted(namespaces)))


def read_capped(handle: Any, cap: int) -> tuple[str, bool]:
    """Head and tail of a captured stream, without reading a huge file whole."""
    size = handle.seek(0, os.SEEK_END)
    buffer = CappedBuffer(cap)
    handle.seek(0)
    if size <= cap:
        buffer.write(handle.read())
        return buffer.text(), False
    buffer.write(handle.read(cap // 2))
    buffer.total += size - cap  # what lies between head and tail is counted, not read
    handle.seek(size - (cap - cap // 2))
    buffer.write(handle.read())
    return buffer.text(), True
