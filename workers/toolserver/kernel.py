"""The IPython kernel the ``python`` tool starts: stock ipykernel minus hand-offs a lone client never needs.

Run as a script (``python .../kernel.py -f CONNECTION_FILE``), not as ``-m workers.toolserver.kernel``,
so the kernel imports neither the tool server's package nor its dependencies, and the user's
``sys.path`` is the one ``ipykernel_launcher`` would give.

Why: on a busy 2-core host a ``1+1`` round trip is dominated by thread wake-ups, not by
work. Stock ipykernel wakes its IOPub thread and waits on an Event for every
``sys.stdout.flush()``/``sys.stderr.flush()``, four of them per execution even when
nothing was printed, and sleeps 0.5 ms (``_execute_sleep``) before every reply. It also
broadcasts ``execute_input`` for other frontends; the tool server is the only client.
Everything else (messages, signing, interrupts) is ipykernel's own.

Output written straight to file descriptors 1 and 2 (``os.system``, subprocesses, C
code) goes through a pipe that ipykernel reads in a thread; stock ipykernel does not wait
for that thread at the end of an execution, so such output could arrive after
``status: idle`` and be lost. Here the flush at the end of every execution drains the
pipe itself, so it cannot.

``kernel.py --fork-server FD`` is the sandbox's kernel fork server: one process that has imported
ipykernel and the classes below once, and forks every kernel of its sandbox from that state, so a
kernel's start costs its own set-up, not an interpreter's start-up and imports
(``workers/toolserver/kernel_forks.py`` is the tool server's end). It runs no code of a job.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

if __name__ == "__main__" and sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]  # the script's own directory: its modules (bash, files, python...) must not shadow the user's

_PR_SET_DUMPABLE, _PR_SET_NAME = 4, 15


def _prctl(option: int, value: int | bytes) -> bool:
    """``prctl(option, value)`` through libc; whether it took."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        argument = ctypes.c_char_p(value) if isinstance(value, bytes) else ctypes.c_ulong(value)
        return libc.prctl(option, argument, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# The fork server outlives the jobs of a reused sandbox and every later kernel is a copy of its memory: not
# dumpable from its first line, before any import, so that no process of the sandbox's user may open its
# /proc/<pid>/mem (ptrace is refused by the seccomp filter anyway).
if __name__ == "__main__" and sys.argv[1:2] == ["--fork-server"] and not _prctl(_PR_SET_DUMPABLE, 0):
    raise SystemExit("kernel fork server: cannot make itself not dumpable (prctl PR_SET_DUMPABLE)")

from ipykernel.iostream import OutStream  # noqa: E402 - after the fork server gave up being dumpable
from ipykernel.ipkernel import IPythonKernel  # noqa: E402

_PIPE_READ = 65536
# An importable name for the classes: IPython replaces __main__ with the user's namespace.
_ALIAS = "rollouts_tool_kernel"


class ToolOutStream(OutStream):
    """An OutStream whose ``flush()`` returns at once when every write is already queued for IOPub.

    Stock ``flush()`` always round-trips through the IOPub thread. Ordering is all the
    protocol needs: a message sent after ``flush()`` must follow the output written
    before it. Messages leave IOPub in the order they were queued, so once ``_flush`` has
    queued the last write there is nothing to wait for. Writes are counted after they
    reach the buffer and marked sent only after ``_flush`` queued what it rotated out.

    ``flush()`` first moves whatever the fd pipe holds into the buffer (under the lock the
    watcher thread reads it with), so fd-level output written before the flush is ordered
    before what follows it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Set before super().__init__, which starts the fd watcher thread.
        self._count_lock = threading.Lock()
        self._written = 0
        self._queued = 0
        self._fd_lock = threading.RLock()
        self._fd_nonblocking = False
        self._fd_eof = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        super().__init__(*args, **kwargs)

    def _watch_pipe_fd(self) -> None:
        """Wait for the pipe without holding the lock, then drain it under the lock."""
        if self._fid is None:
            return
        try:
            poller = select.poll()
            poller.register(self._fid, select.POLLIN)
            while self._should_watch and not self._fd_eof:
                poller.poll()
                self._drain_fd()
        except Exception:  # noqa: BLE001 - reported by close(), as ipykernel does
            self._exc = sys.exc_info()

    def _drain_fd(self) -> None:
        """Move everything the pipe holds now into the stream's buffer (and echo it to the original fd)."""
        fid = self._fid
        if fid is None:
            return
        chunks = []
        with self._fd_lock:
            if not self._fd_nonblocking:
                os.set_blocking(fid, False)
                self._fd_nonblocking = True
            while not self._fd_eof:
                try:
                    data = os.read(fid, _PIPE_READ)
                except BlockingIOError:
                    break
                if not data:
                    self._fd_eof = True
                    break
                if not self._should_watch:  # closing: the byte close() wrote to wake the watcher
                    continue
                chunks.append(data)
                text = self._decoder.decode(data)
                if text:
                    self.write(text)
        for data in chunks:  # outside the lock: a slow original fd must not stall a flush
            os.write(self._original_stdstream_copy, data)

    def write(self, string: str) -> int | None:  # type: ignore[override]
        written = super().write(string)
        with self._count_lock:
            self._written += 1
        return written

    def _flush(self) -> None:
        with self._count_lock:
            seen = self._written
        super()._flush()
        with self._count_lock:
            self._queued = max(self._queued, seen)

    def flush(self) -> None:
        # Only the kernel itself drains: a forked child shares the pipe but not the watcher.
        if self._should_watch and self._fid is not None and self._is_master_process():
            self._drain_fd()
        with self._count_lock:
            pending = self._written != self._queued
        if pending or self.echo is not None:
            super().flush()


class _QueuedSend:
    """Queues a message on the IOPub thread without waking it: it leaves with the next one that does.

    For ``status: busy`` and ``execute_result``: ``status: idle`` always follows them (and
    wakes the thread), so one wake-up sends all three together, in order, instead of three.
    """

    def __init__(self, iopub_thread: Any) -> None:
        self.iopub_thread = iopub_thread

    def send_multipart(self, parts: Any, *args: Any, **kwargs: Any) -> None:
        thread = self.iopub_thread
        if thread.thread is not None and thread.thread.is_alive():
            thread._events.append(lambda: thread._really_send(parts, *args, **kwargs))
        else:  # a forked child, or shutting down: send now, as IOPubThread.schedule does
            thread._really_send(parts, *args, **kwargs)


class ToolKernel(IPythonKernel):
    """IPythonKernel without the reply sleep, the ``execute_input`` broadcast, and with lazy sends."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # A FIXME workaround for clients that read the reply before the output; ours waits
        # for ``status: idle`` on IOPub, which is queued after all output.
        self._execute_sleep = 0.0
        thread = self.iopub_thread
        if hasattr(thread, "_events") and hasattr(thread, "_really_send"):
            self._queued_iopub: Any = _QueuedSend(thread)
            self.shell.displayhook.pub_socket = self._queued_iopub
        else:  # an ipykernel whose IOPub thread changed: slower, never broken
            self._queued_iopub = self.iopub_socket

    def _publish_status(self, status: str, channel: str, parent: Any = None) -> None:
        """``busy`` waits for the next message that wakes the IOPub thread; the rest go at once."""
        if status != "busy" or not self.session:
            super()._publish_status(status, channel, parent)
            return
        self.session.send(
            self._queued_iopub,
            "status",
            {"execution_state": status},
            parent=parent or self.get_parent(channel),
            ident=self._topic("status"),
        )

    def _publish_execute_input(self, code: str, parent: Any, execution_count: int) -> None:
        """Skipped: only other frontends watching the same kernel would read it."""


def main() -> None:
    from ipykernel.kernelapp import IPKernelApp

    sys.modules.setdefault(_ALIAS, sys.modules[__name__])
    IPKernelApp.launch_instance(kernel_class=ToolKernel, outstream_class=f"{_ALIAS}.ToolOutStream")


class _ForkServer:
    """Forks kernels on request and reports their exits, one JSON line each way, single-threaded.

    Requests: ``{"op": "start", "argv", "cwd", "env"}`` (answer ``{"pid"}``), ``{"op": "signal", "pid",
    "signal"}`` (to the kernel's process group; answer ``{"ok"}``, false once it was reaped); each
    answer repeats its request's ``id``. Unasked: ``{"exited": pid}`` once a kernel was reaped. Only this process reaps its kernels and
    it signals only unreaped ones, so a pid it signals is never another process's.
    """

    def __init__(self, sock: socket.socket, kernel_name: str) -> None:
        self.sock = sock
        self.kernel_name = kernel_name
        self.kernels: set[int] = set()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)

    def serve(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self._send({"ready": True, "pid": os.getpid()})
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        pending = b""
        while True:
            for fd, _ in poller.poll():
                if fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                    self._reap()
                    continue
                data = self.sock.recv(65536)
                if not data:  # the tool server is gone: so are its kernels
                    self._kill_all()
                    return
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    self._answer(json.loads(line))

    def _send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def _answer(self, request: dict[str, Any]) -> None:
        answer: dict[str, Any] = {"id": request.get("id")}
        if request.get("op") == "start":
            answer["pid"] = self._fork(request)
        elif request.get("op") == "signal":
            pid = request.get("pid")
            self._reap()  # a kernel that is gone is reported, never signalled
            answer["ok"] = pid in self.kernels
            if answer["ok"]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, int(request["signal"]))
        else:
            answer["error"] = f"unknown op {request.get('op')!r}"
        self._send(answer)

    def _reap(self) -> None:
        for pid in list(self.kernels):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            self.kernels.discard(pid)
            self._send({"exited": pid})

    def _kill_all(self) -> None:
        for pid in self.kernels:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def _fork(self, request: dict[str, Any]) -> int:
        pid = os.fork()
        if pid:
            self.kernels.add(pid)
            return pid
        code = 1
        try:
            self._become_kernel(request)
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:  # noqa: BLE001 - reported on the kernel's stderr, then the child ends
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

    def _become_kernel(self, request: dict[str, Any]) -> None:
        """In the child: nothing of the fork server's (its socket, its signal handling), a session of
        its own (an interrupt or a kill reaches what the kernel started), and the request's place."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        os.setsid()
        _prctl(_PR_SET_DUMPABLE, 1)  # the job's own process, as a fresh interpreter would be
        _prctl(_PR_SET_NAME, self.kernel_name.encode())
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [__file__, *request["argv"]]


def serve_forks(fd: int, name: str, kernel_name: str) -> None:
    """Run as the sandbox's kernel fork server on the connected socket ``fd``, named ``name``; its kernels
    are named ``kernel_name`` (the names come from kernel_forks.py, which the worker's checks import)."""
    _prctl(_PR_SET_NAME, name.encode())
    # What a kernel's start would import, imported once here (``ipykernel.ipkernel`` came with the classes).
    from ipykernel.kernelapp import IPKernelApp  # noqa: F401

    # Kernels share the imported modules' memory with this process until they write to it: with them
    # out of the collector's reach, a kernel's garbage collections do not copy those pages.
    gc.freeze()
    _ForkServer(socket.socket(fileno=fd), kernel_name).serve()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fork-server"]:
        serve_forks(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
