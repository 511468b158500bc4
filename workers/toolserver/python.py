"""One persistent IPython kernel per sandbox, driven through jupyter_client.

The kernel talks ZeroMQ over the ``ipc`` transport: its five channels are Unix
sockets in the server's state directory, so no TCP port is opened (the sandbox
has no network, and ports would clash between sandboxes sharing a host
network). The kernel starts on the first ``python`` call: most bash-only
rollouts never pay its start-up.

The kernel is ipykernel run through ``kernel.py`` (fewer thread hand-offs per call), forked by
the sandbox's kernel fork server (``kernel_forks.py``: a restart costs a fork, not an
interpreter's imports), and the hot path reads the client's ZeroMQ sockets directly:
jupyter_client's blocking ``get_iopub_msg`` runs an asyncio loop for every message it returns.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.toolserver.kernel_forks import ForkServerError, KernelForks
from workers.toolserver.output import CappedBuffer, cap_text

if TYPE_CHECKING:  # imported when the kernel starts: a sandbox that never runs python skips ~0.2 s of imports
    import zmq
    from jupyter_client import BlockingKernelClient

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_INTERRUPT_GRACE_S = 5.0
_READY_TIMEOUT_S = 60.0
_LAST_OUTPUT_S = 0.05  # how long a dead kernel's last output may still be on its way to us
_DELIM = b"<IDS|MSG>"
KERNEL_DIED = "the Python kernel died (restarted; state was lost)"

# Why _collect stopped.
_IDLE, _DEADLINE, _OVERFLOW, _DEAD = "idle", "deadline", "overflow", "dead"


@dataclass
class PythonOutcome:
    stdout: str
    stderr: str
    result: str | None
    error: str | None
    timed_out: bool = False
    restarted: bool = False
    truncated: bool = False  # stream output was cut while collecting
    overflowed: bool = False  # output passed the hard cap and the execution was interrupted
    died: bool = False  # the kernel died during the execution (and was restarted)

    def render(self, cap: int) -> tuple[str, bool]:
        parts = [self.stdout]
        if self.stderr:
            parts.append(self.stderr)
        if self.result is not None:
            parts.append(self.result if self.result.endswith("\n") else self.result + "\n")
        if self.error:
            parts.append(self.error)
        text, truncated = cap_text("".join(parts), cap)
        return text, truncated or self.truncated


class PythonKernel:
    """Starts, runs code in, interrupts and stops one IPython kernel."""

    def __init__(
        self,
        cwd: Path,
        env: dict[str, str],
        state_dir: Path,
        transport: str = "ipc",
        output_cap: int = 16 * 1024,
        hard_output_cap: int = 8 * 1024 * 1024,
    ) -> None:
        self.cwd = cwd
        self.env = env
        self.state_dir = state_dir
        self.transport = transport
        self.output_cap = output_cap
        self.hard_output_cap = max(hard_output_cap, output_cap)
        self.forks = KernelForks(env)
        self.pid: int | None = None
        self.client: BlockingKernelClient | None = None
        self._poller: zmq.Poller | None = None

    @property
    def started(self) -> bool:
        return self.pid is not None

    def alive(self) -> bool:
        return self.pid is not None and self.forks.alive(self.pid)

    def start(self) -> None:
        """Fork a kernel (starting the fork server first if need be) and wait until it answers."""
        from jupyter_client import BlockingKernelClient
        from jupyter_client.connect import write_connection_file

        deadline = time.monotonic() + _READY_TIMEOUT_S
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.forks.start(timeout=_READY_TIMEOUT_S)
        ip = str(self.state_dir / "k") if self.transport == "ipc" else "127.0.0.1"
        connection_file, _ = write_connection_file(str(self.state_dir / "kernel.json"), ip=ip, transport=self.transport)
        env = {**self.env, "IPYTHONDIR": str(self.state_dir / "ipython"), "JPY_PARENT_PID": ""}
        argv = ["-f", connection_file, "--HistoryManager.enabled=False", "--colors=NoColor"]
        self.pid = self.forks.spawn(argv, self.cwd, env)
        try:
            client = BlockingKernelClient(connection_file=connection_file)
            client.load_connection_file()
            # No heartbeat thread: liveness is the kernel process's (the fork server reports its exit).
            client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
            self.client = client
            self._poller = self._iopub_or_exit_poller(client.iopub_channel.socket)
            self._wait_ready(deadline)
        except Exception:
            self.close_kernel()
            raise

    def _iopub_or_exit_poller(self, iopub: zmq.Socket) -> zmq.Poller:
        """A poll over IOPub and the fork server's socket: a kernel's death (reported there) ends a wait
        for its output at once, not at the next liveness check."""
        import zmq

        poller = zmq.Poller()
        poller.register(iopub, zmq.POLLIN)
        reports = self.forks.fileno()
        if reports is not None:
            poller.register(reports, zmq.POLLIN)
        return poller

    def _wait_ready(self, deadline: float) -> None:
        """Until the kernel answers ``kernel_info`` and its IOPub reaches us (else early output is lost)."""
        assert self.client is not None and self.pid is not None
        shell: zmq.Socket = self.client.shell_channel.socket
        iopub: zmq.Socket = self.client.iopub_channel.socket
        while time.monotonic() < deadline:
            self.client.kernel_info()
            answered = shell.poll(1000) and (self.client.session.recv(shell)[1] or {}).get("msg_type")
            if answered == "kernel_info_reply" and iopub.poll(200):
                iopub.recv_multipart()
                return
            if not self.forks.alive(self.pid):
                raise ForkServerError("the Python kernel died while starting")
        raise ForkServerError(f"the Python kernel did not answer within {_READY_TIMEOUT_S:.0f} s")

    def interrupt(self) -> None:
        if self.pid is not None:
            self.forks.send_signal(self.pid, signal.SIGINT)

    def close_kernel(self) -> None:
        """Stop the kernel (the fork server stays for the next); its sockets and connection file go."""
        pid, client = self.pid, self.client
        self.pid = self.client = self._poller = None
        if client is not None:
            client.stop_channels()
        if pid is not None and self.forks.send_signal(pid, signal.SIGKILL):
            self.forks.wait_exited(pid, 10.0)
        for leftover in [self.state_dir / "kernel.json", *self.state_dir.glob("k-*")]:
            with contextlib.suppress(OSError):
                os.unlink(leftover)

    def close(self) -> None:
        """Stop the kernel and the fork server: the tool server (or whoever holds this) is done with python."""
        self.close_kernel()
        self.forks.stop()

    def run(self, code: str, timeout: float) -> PythonOutcome:
        """Execute ``code``; stream output is kept in bounded memory (head and tail, ``output_cap``).

        Past ``hard_output_cap`` bytes of stream output the execution is interrupted,
        as bash's runaway output is. A kernel that dies mid-call is restarted at once
        (not waited on until the timeout) and reported as an error.
        """
        if not self.alive():
            self.close_kernel()
            self.start()
        assert self.client is not None
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False)
        collector = _Collector(self.output_cap)
        outcome = PythonOutcome("", "", None, None)
        try:
            end = self._collect(msg_id, time.monotonic() + timeout, collector)
            if end == _IDLE:
                self._drain_replies()
                return outcome
            if end == _DEAD:
                self._restart_dead(outcome)
                return outcome
            if end == _OVERFLOW:
                outcome.overflowed = True
            else:
                outcome.timed_out = True
            self.interrupt()
            end = self._collect(msg_id, time.monotonic() + _INTERRUPT_GRACE_S, collector, check_overflow=False)
            if end == _IDLE:
                self._drain_replies()
            elif end == _DEAD:
                self._restart_dead(outcome)
            else:
                self.close_kernel()
                self.start()
                outcome.restarted = True
            return outcome
        finally:
            collector.finish(outcome)

    def _restart_dead(self, outcome: PythonOutcome) -> None:
        self.close_kernel()
        self.start()
        outcome.restarted = outcome.died = True
        outcome.error = (outcome.error or "") + KERNEL_DIED + "\n"

    def _drain_replies(self) -> None:
        """Discard execute_replies: everything is taken from iopub, and unread replies would pile up."""
        assert self.client is not None
        shell: zmq.Socket = self.client.shell_channel.socket
        while shell.poll(0):
            shell.recv_multipart(copy=False)

    def _next_iopub(self, msg_id: str, timeout: float) -> tuple[str, dict[str, Any]] | None:
        """The next IOPub message of execution ``msg_id`` as (type, content); ("", {}) for another's.

        None after ``timeout`` seconds. One zmq poll, no event loop. The signature is checked
        as ``Session.deserialize`` does (and replays refused), but only the frames needed are
        parsed: its date parsing of every header is most of a message's decoding cost.
        """
        assert self.client is not None and self._poller is not None
        iopub: zmq.Socket = self.client.iopub_channel.socket
        ready = dict(self._poller.poll(int(timeout * 1000)))
        if iopub not in ready:
            reports = self.forks.fileno()
            if ready and (reports is None or reports not in ready):  # the fork server is gone: its socket's
                self._poller = self._iopub_or_exit_poller(iopub)  # end of file would end every wait at once
            return None  # the caller checks whether the kernel still lives
        frames = iopub.recv_multipart()
        session = self.client.session
        try:
            signature, header, parent, metadata, content = frames[frames.index(_DELIM) + 1 :][:5]
        except ValueError:
            raise ValueError("malformed IOPub message") from None
        if session.auth is not None:
            if not signature or signature in session.digest_history:
                raise ValueError("unsigned or replayed IOPub message")
            if not hmac.compare_digest(signature, session.sign([header, parent, metadata, content])):
                raise ValueError("IOPub message with an invalid signature")
            session._add_digest(signature)  # the replay window Session.deserialize keeps
        if session.unpack(parent).get("msg_id") != msg_id:
            return "", {}
        return session.unpack(header)["msg_type"], session.unpack(content)

    def _collect(self, msg_id: str, deadline: float, collector: _Collector, check_overflow: bool = True) -> str:
        """Gather iopub output of one execution until the kernel is idle, dies, or runs out of time/room."""
        assert self.client is not None
        dead_at: float | None = None  # when the kernel was seen dead: what it sent before may still be in flight
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return _DEADLINE
            wait = min(remaining, 1.0) if dead_at is None else dead_at + _LAST_OUTPUT_S - now
            msg = self._next_iopub(msg_id, max(wait, 0.0))
            if msg is None:
                if self.alive():  # (which also reads what the fork server said, so the next wait blocks)
                    continue
                if dead_at is None:
                    dead_at = time.monotonic()
                elif time.monotonic() >= dead_at + _LAST_OUTPUT_S:
                    return _DEAD
                continue
            kind, content = msg
            if kind == "stream":
                collector.stream(content.get("name") == "stderr", content.get("text", ""))
                if check_overflow and collector.total > self.hard_output_cap:
                    return _OVERFLOW
            elif kind in ("execute_result", "display_data"):
                text = content.get("data", {}).get("text/plain")
                if text is not None:
                    if kind == "execute_result":
                        collector.result = text
                    else:
                        collector.stream(False, text + "\n")
                        if check_overflow and collector.total > self.hard_output_cap:
                            return _OVERFLOW
            elif kind == "error":
                collector.error = _ANSI.sub("", "\n".join(content.get("traceback", []))) + "\n"
            elif kind == "status" and content.get("execution_state") == "idle":
                return _IDLE


class _Collector:
    """Stream output of one execution in bounded memory (no quadratic string concatenation)."""

    def __init__(self, cap: int) -> None:
        self.stdout = CappedBuffer(cap)
        self.stderr = CappedBuffer(cap)
        self.result: str | None = None
        self.error: str | None = None

    @property
    def total(self) -> int:
        return self.stdout.total + self.stderr.total

    def stream(self, stderr: bool, text: str) -> None:
        (self.stderr if stderr else self.stdout).write(text.encode("utf-8", errors="replace"))

    def finish(self, outcome: PythonOutcome) -> None:
        outcome.stdout = self.stdout.text()
        outcome.stderr = self.stderr.text()
        outcome.result = self.result
        if self.error is not None:
            outcome.error = self.error + (outcome.error or "")
        outcome.truncated = self.stdout.truncated or self.stderr.truncated
