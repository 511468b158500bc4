"""The tool server's end of its sandbox's kernel fork server (``kernel.py --fork-server``).

A kernel started as a fresh interpreter pays Python's start-up and ipykernel's imports every time
(~0.3 s of its ~0.5 s of CPU here). The fork server pays them once per sandbox; every kernel after
that (a restart after a timeout or a death, a reused sandbox's fresh kernel for its next job) is a
fork of it and costs only its own set-up. The fork server runs as the sandbox's user, inside the
sandbox, as a child of the tool server: it is no way around the sandbox, only a faster way to
start what the sandbox would have started anyway.

The fork server is the kernels' parent: it alone reaps them and signals them (only while they are
unreaped, so a pid is never another process's), and says when one has exited. Requests are one
JSON line each over a socket pair, answered in order; exits arrive between answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from workers.toolserver.reaper import alive as process_alive

KERNEL_SCRIPT = Path(__file__).with_name("kernel.py")


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
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pid(self) -> int | None:
        """The fork server's pid while it runs (the tool server waits for it: not an orphan to reap)."""
        return self.proc.pid if self.running and self.proc is not None else None

    def fileno(self) -> int | None:
        """The socket the fork server reports exits on, while it runs: readable when it says something."""
        return self._sock.fileno() if self._sock is not None and self.running else None

    def start(self, timeout: float) -> None:
        """Start the fork server and wait until it has imported what a kernel needs."""
        with self._lock:
            if self.running:
                return
            self._stop_locked()
            ours, theirs = socket.socketpair()
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, str(KERNEL_SCRIPT), "--fork-server", str(theirs.fileno())],
                    pass_fds=[theirs.fileno()],
                    stdin=subprocess.DEVNULL,
                    cwd="/",  # each kernel gets its own; the server holds no directory of a job
                    env=self.env,
                )
            finally:
                theirs.close()
            self._sock, self._pending, self._exited = ours, b"", set()
            self._read_reply(time.monotonic() + timeout)

    def spawn(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 30.0) -> int:
        """A new kernel (``kernel.py`` with ``argv``) forked in ``cwd`` with exactly ``env``; its pid."""
        reply = self._request({"op": "start", "argv": argv, "cwd": str(cwd), "env": env}, timeout)
        pid = reply.get("pid")
        if not isinstance(pid, int):
            raise ForkServerError(f"the fork server did not start a kernel: {reply}")
        return pid

    def send_signal(self, pid: int, signum: int) -> bool:
        """Send ``signum`` to kernel ``pid``'s process group; False once the kernel has exited."""
        if not self.running:  # the kernel, if still there, is now the tool server's orphan
            if not process_alive(pid):
                return False
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signum)
            return True
        try:
            return bool(self._request({"op": "signal", "pid": pid, "signal": int(signum)}, 10.0).get("ok"))
        except ForkServerError:
            return False

    def alive(self, pid: int) -> bool:
        """Whether kernel ``pid`` is still running (no exit reported for it)."""
        if not self.running:
            return process_alive(pid)
        with self._lock:
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
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _request(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            if self._sock is None or not self.running:
                raise ForkServerError("the kernel fork server is not running")
            try:
                self._sock.sendall(json.dumps(request).encode() + b"\n")
            except OSError as exc:
                raise ForkServerError(f"the kernel fork server is gone: {exc}") from exc
            return self._read_reply(time.monotonic() + timeout)

    def _read_reply(self, deadline: float) -> dict[str, Any]:
        """The next answer (exit reports before it are recorded), within the deadline."""
        while True:
            message = self._next_message(deadline)
            if "exited" in message:
                self._exited.add(int(message["exited"]))
                continue
            return message

    def _read_available(self) -> None:
        """Record the exit reports that have arrived, without waiting."""
        while b"\n" in self._pending or self._readable(0):
            message = self._next_message(time.monotonic())
            if "exited" in message:
                self._exited.add(int(message["exited"]))

    def _readable(self, timeout: float) -> bool:
        assert self._sock is not None
        return bool(select.select([self._sock], [], [], max(timeout, 0))[0])

    def _next_message(self, deadline: float) -> dict[str, Any]:
        assert self._sock is not None
        while b"\n" not in self._pending:
            if not self._readable(deadline - time.monotonic()):
                if self.running:
                    raise ForkServerError("the kernel fork server did not answer in time")
                raise ForkServerError("the kernel fork server exited")
            data = self._sock.recv(65536)
            if not data:
                raise ForkServerError("the kernel fork server exited")
            self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)
