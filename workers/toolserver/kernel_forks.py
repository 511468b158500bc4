"""The tool server's end of its sandbox's kernel fork server (``kernel.py --fork-server``).

A kernel started as a fresh interpreter pays Python's start-up and ipykernel's imports every time
(~0.3 s of its ~0.5 s of CPU here). The fork server pays them once per sandbox; every kernel after
that (a restart after a timeout or a death, a reused sandbox's fresh kernel for its next job) is a
fork of it and costs only its own set-up. The fork server runs as the sandbox's user, inside the
sandbox, as a child of the tool server: it is no way around the sandbox, only a faster way to
start what the sandbox would have started anyway.

The fork server is the kernels' parent: it alone reaps them and signals them (only while they are
unreaped, so a pid is never another process's), and says when one has exited. Requests are one
JSON line each over a socket pair, each with an id its answer repeats; exits arrive between
answers. A request not answered in time stops the fork server (and so its kernels): what it
would still say could only be mistaken for the answer to a later request.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from workers.toolserver.reaper import start_ticks

KERNEL_SCRIPT = Path(__file__).with_name("kernel.py")
# What ``ps -o comm`` and /proc/<pid>/comm show (kernel.py sets them): a fork keeps its parent's argv.
FORK_SERVER_NAME, KERNEL_NAME = "kernel-forks", "ipykernel"
_ORPHANS_DEATH_S = 5.0  # a bound on waiting for a stopped fork server's kernels to die, not a pace


class ForkServerError(RuntimeError):
    """The fork server could not start, or stopped answering: the python tool reports it as an error."""


class KernelForks:
    """Starts the fork server on first use and asks it for kernels; thread-safe."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._pending = b""
        self._exited: set[int] = set()
        self._started: dict[int, int | None] = {}  # kernel pid -> its start ticks, to signal it once orphaned
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        proc = self.proc
        return proc is not None and proc.poll() is None

    def pid(self) -> int | None:
        """The fork server's pid while it runs (the tool server waits for it: not an orphan to reap)."""
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def fileno(self) -> int | None:
        """The socket the fork server reports exits on, while it runs: readable when it says something."""
        sock = self._sock
        return sock.fileno() if sock is not None and self.running else None

    def start(self, timeout: float) -> None:
        """Start the fork server and wait until it has imported what a kernel needs."""
        with self._lock:
            if self.running:
                return
            self._stop_locked()
            ours, theirs = socket.socketpair()
            try:
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        str(KERNEL_SCRIPT),
                        "--fork-server",
                        str(theirs.fileno()),
                        FORK_SERVER_NAME,
                        KERNEL_NAME,
                    ],
                    pass_fds=[theirs.fileno()],
                    stdin=subprocess.DEVNULL,
                    cwd="/",  # each kernel gets its own; the server holds no directory of a job
                    env=self.env,
                )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            self._sock, self._pending, self._exited, self._started = ours, b"", set(), {}
            if not self._read_reply(time.monotonic() + timeout, None).get("ready"):
                self._stop_locked()
                raise ForkServerError("the kernel fork server did not say it was ready")

    def spawn(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 30.0) -> int:
        """A new kernel (``kernel.py`` with ``argv``) forked in ``cwd`` with exactly ``env``; its pid."""
        with self._lock:
            reply = self._request_locked({"op": "start", "argv": argv, "cwd": str(cwd), "env": env}, timeout)
            pid = reply.get("pid")
            if not isinstance(pid, int):
                raise ForkServerError(f"the fork server did not start a kernel: {reply}")
            self._exited.discard(pid)  # an earlier kernel's, reaped long before this pid was given again
            self._started[pid] = start_ticks(pid)  # unreaped until the fork server says it exited
            return pid

    def send_signal(self, pid: int, signum: int) -> bool:
        """Send ``signum`` to kernel ``pid``'s process group; False once the kernel has exited."""
        with self._lock:
            if self._sock is not None and self.running:
                with contextlib.suppress(ForkServerError):
                    return bool(
                        self._request_locked({"op": "signal", "pid": pid, "signal": int(signum)}, 10.0).get("ok")
                    )
                return False
            # The fork server is gone and the kernel, if still there, is the tool server's orphan: signalled
            # only while it is the same process (same start), never a process that was given its pid since.
            started = self._started.get(pid)
            if started is None or start_ticks(pid) != started:
                return False
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signum)
            return True

    def alive(self, pid: int) -> bool:
        """Whether kernel ``pid`` is still running (no exit reported for it)."""
        with self._lock:
            if self._sock is None or not self.running:
                started = self._started.get(pid)
                return started is not None and start_ticks(pid) == started
            with contextlib.suppress(ForkServerError):
                self._read_available()
            return pid not in self._exited

    def wait_exited(self, pid: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s until kernel ``pid`` has exited and was reaped."""
        deadline = time.monotonic() + timeout
        while self.alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def stop(self) -> None:
        """Stop the fork server; it kills the kernels it still has as it goes (their sessions too)."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        sock, proc = self._sock, self.proc
        self._sock = self.proc = None
        if sock is not None:
            sock.close()  # end of input: the fork server kills its kernels and exits
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # stopped, or stuck: killed before it could kill its kernels
                proc.kill()
                proc.wait()
        orphans = [pid for pid, started in self._started.items() if started is not None and start_ticks(pid) == started]
        for pid in orphans:  # what it left: the tool server's orphans now, killed while still themselves
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + _ORPHANS_DEATH_S
        while any(start_ticks(pid) == self._started[pid] for pid in orphans) and time.monotonic() < deadline:
            time.sleep(0.005)  # dead before anyone asks whether the kernel still lives

    def _request_locked(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self._sock is None or not self.running:
            raise ForkServerError("the kernel fork server is not running")
        request_id = next(self._ids)
        try:
            self._sock.sendall(json.dumps({**request, "id": request_id}).encode() + b"\n")
        except OSError as exc:
            self._stop_locked()
            raise ForkServerError(f"the kernel fork server is gone: {exc}") from exc
        return self._read_reply(time.monotonic() + timeout, request_id)

    def _read_reply(self, deadline: float, request_id: int | None) -> dict[str, Any]:
        """The answer to ``request_id`` (None: the ready message), recording the exit reports before it.
        Not in time, or not readable: the fork server is stopped, so that nothing it says later is misread."""
        try:
            while True:
                message = self._next_message(deadline)
                if "exited" in message:
                    self._record_exit(int(message["exited"]))
                elif message.get("id") == request_id:
                    return message
        except (ForkServerError, ValueError, TypeError) as exc:
            self._stop_locked()
            raise ForkServerError(f"the kernel fork server stopped answering: {exc}") from exc

    def _read_available(self) -> None:
        """Record the exit reports that have arrived, without waiting."""
        while b"\n" in self._pending or self._readable(0):
            message = self._next_message(time.monotonic())
            if "exited" in message:
                self._record_exit(int(message["exited"]))

    def _record_exit(self, pid: int) -> None:
        self._exited.add(pid)
        self._started.pop(pid, None)

    def _readable(self, timeout: float) -> bool:
        assert self._sock is not None
        poller = select.poll()  # not select(): a process with over 1,024 open files has fds it cannot name
        poller.register(self._sock, select.POLLIN)
        return bool(poller.poll(max(timeout, 0) * 1000))

    def _next_message(self, deadline: float) -> dict[str, Any]:
        assert self._sock is not None
        while b"\n" not in self._pending:
            if not self._readable(deadline - time.monotonic()):
                raise ForkServerError("no answer in time" if self.running else "it exited")
            data = self._sock.recv(65536)
            if not data:
                raise ForkServerError("it exited")
            self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError(f"not a message: {line[:80]!r}")
        return message
