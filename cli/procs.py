"""Child processes that cannot outlive the process that started them, and stopping them."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A Popen preexec_fn: the child gets `sig` when its parent dies (Linux), even by SIGKILL.

    The stack's children run in sessions of their own (so a terminal's Ctrl-C reaches only the
    parent, which stops them in order); without this, a parent killed outright would leave
    Redis, the API and the workers running with nobody to stop them.

    The kernel sends the signal when the *thread* that forked the child exits, so it is armed
    only for children spawned from the main thread (None otherwise: no preexec_fn).
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def arm() -> None:
        with contextlib.suppress(OSError, AttributeError):  # not Linux: the parent's own shutdown is all there is
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    return arm


def stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; returns once it is reaped."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
