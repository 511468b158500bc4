"""Runs vLLM so that its whole process tree ends with the process that started it, however that ends.

`python -I -S cli/vllm_watchdog.py LIFELINE_FD -- <vllm argv>`, standard library only. vLLM's API
server starts EngineCore (and, with several GPUs, worker) processes of its own; a parent-death
signal on the API server reaches only the API server, so a `rollouts up` killed outright (SIGKILL,
the OOM killer, a node's job ending) used to leave the engine holding memory with nobody to stop it.

The starter runs this script as the leader of a new session (so vLLM and everything it spawns share
its process group) and passes the read end of a pipe whose write end only the starter holds: when
the starter dies, by any means, the pipe reports end-of-file and the watchdog SIGKILLs the group,
itself included. When vLLM exits on its own, the watchdog kills what it left in the group and exits
with vLLM's status. A SIGTERM to the group (the starter's orderly stop) reaches vLLM directly; the
watchdog ignores it and waits for vLLM. Nothing is found by name: only this process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1


def _die_with_watchdog() -> None:
    """vLLM's API server gets SIGKILL if the watchdog itself is killed (its engine is in our group)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _kill_group_but_me() -> None:
    """SIGKILL every other process of our process group (what vLLM left behind)."""
    me, group = os.getpid(), os.getpgrp()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: vllm_watchdog.py LIFELINE_FD -- COMMAND...", file=sys.stderr)
        return 2
    lifeline = int(argv[0])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # the group's signal reaches vLLM itself; we wait for it
    child = subprocess.Popen(argv[2:], preexec_fn=_die_with_watchdog, pass_fds=())  # noqa: PLW1509 - prctl only
    child_fd = os.pidfd_open(child.pid)
    while True:
        try:
            ready, _, _ = select.select([lifeline, child_fd], [], [])
        except InterruptedError:
            continue
        if lifeline in ready and not os.read(lifeline, 1):  # the starter is gone
            os.killpg(os.getpgrp(), signal.SIGKILL)
        if child_fd in ready:
            code = child.wait()
            _kill_group_but_me()
            return _status(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
