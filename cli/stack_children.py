"""How the local stack starts its child processes and ends them.

Each child runs in a session of its own (a terminal's Ctrl-C reaches only `rollouts up`, which stops
the children in order), dies with its parent, and writes to `<log_dir>/<name>.log` when the stack
keeps logs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from cli.procs import die_with_parent
from cli.supervision import StayDown


class ChildProcesses:
    """Spawns the stack's children with its environment (read at each spawn: the API's port may be new)
    and keeps their log files open until `close_logs`."""

    def __init__(self, log_dir: Path | None, env: Callable[[], dict[str, str]], stopping: threading.Event) -> None:
        self.log_dir = log_dir
        self._env = env
        self._stopping = stopping
        self._logs: list[IO[bytes]] = []

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        if self._stopping.is_set():  # a restart that ran into stop(): start nothing stop() would not see
            raise StayDown("the stack is stopping")
        output: IO[bytes] | None = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - close_logs() closes it
            self._logs.append(output)
        # Each child gets its own process group, so a terminal's Ctrl-C reaches only us and
        # we stop the children in order (workers drain first, then the API).
        return subprocess.Popen(
            argv,
            env=self._env(),
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 - it only calls prctl
        )

    def close_logs(self) -> None:
        for log in self._logs:
            log.close()
        self._logs.clear()


def terminate(processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM to each at once, then SIGKILL to any still running after `timeout`; returns once all are reaped."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal a child's process group (each child leads one: start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
