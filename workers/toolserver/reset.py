"""The inside half of a reused sandbox's reset: leave nothing of the last job but the tool server.

The shell and the kernel are stopped, and every other process under the server (it is a child
subreaper, so a ``setsid`` or double-forked daemon is re-parented to it) but the kernel fork
server, which ran no job's code, is killed in one pass over a snapshot. A process alive after
that pass was not in the snapshot: it was born while we killed (a process that respawns
itself), and we do not chase it; the reset says so and the
worker discards the sandbox, whose stop kills its whole pid namespace at once. /tmp and the
server's state directory are emptied as the sandbox's own user, who cannot undo what it made
unremovable (a ``chmod 000`` tree): that too is reported, never fixed. The worker checks the
result from outside (workers/sandbox/reset.py); this half's word alone proves nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from workers.toolserver.reaper import alive, descendants, reap_orphans
from workers.toolserver.tools import ToolBox

# How long killed processes get to die before the reset gives up on proving it (a bound, not a pace).
_DEATH_WAIT_S = 10.0


def _kill_once(pids: list[int]) -> list[int]:
    """SIGKILL each pid once and wait until it is dead; the pids still alive at the bound."""
    for pid in pids:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _DEATH_WAIT_S
    left = [pid for pid in pids if alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.005)
        left = [pid for pid in left if alive(pid)]
    return left


def _reap_all(kept: frozenset[int]) -> list[int]:
    """Reap every dead process under the server (the next job's ``ps`` must not list the last one's);
    what is left but ``kept``: live ones (born during the kill) or ones not reaped within the bound."""
    deadline = time.monotonic() + _DEATH_WAIT_S
    while True:
        reap_orphans(kept)
        left = [pid for pid in descendants(os.getpid()) if pid not in kept]
        if not left or any(alive(pid) for pid in left) or time.monotonic() > deadline:
            return left
        time.sleep(0.005)


def _empty_dir(path: Path, keep: frozenset[str] = frozenset()) -> list[str]:
    """Remove everything inside ``path`` but the ``keep`` names (mount points) without changing any
    permission; what could not be removed."""
    problems: list[str] = []
    try:
        entries = list(os.scandir(path))
    except OSError as exc:
        return [f"cannot list {path}: {exc}"]
    for entry in entries:
        if entry.name in keep:
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError as exc:
            problems.append(f"cannot remove {entry.path}: {exc}")
    return problems


def reset_toolbox(toolbox: ToolBox, scratch: Path, keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Stop the shell and kernel, kill every other process once but the kernel fork server the last warm-up
    left (it ran no job's code: each kernel was a fork of it), empty ``scratch`` (but its mount points,
    ``keep``) and the state dir.

    Returns ``{"clean": bool, "problems": [...]}``; the shell and kernel stay stopped until ``warm``.
    """
    problems: list[str] = []
    with ExitStack() as held:
        for lock in toolbox.locks():  # no call of the last job runs during its reset
            held.enter_context(lock)
        fork_server = toolbox.fork_server_to_keep()
        kept = frozenset() if fork_server is None else frozenset({fork_server})
        # the shell and the kernel too: their owners then find them dead
        snapshot = [pid for pid in descendants(os.getpid()) if pid not in kept]
        unkillable = _kill_once(snapshot)
        toolbox.close(keep_fork_server=bool(kept))
        if unkillable:
            problems.append(f"{len(unkillable)} processes did not die")
        left = _reap_all(kept)
        if left:
            problems.append(f"{len(left)} processes left after the kill pass (born during it: respawning)")
        problems += _empty_dir(scratch, keep)
        problems += _empty_dir(toolbox.state_dir)
    return {"clean": not problems, "problems": problems}
