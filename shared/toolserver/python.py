"""One persistent IPython kernel per sandbox, driven through jupyter_client.

The kernel talks ZeroMQ over the ``ipc`` transport: its five channels are Unix
sockets in the server's state directory, so no TCP port is opened (the sandbox
has no network, and ports would clash between sandboxes sharing a host
network). The kernel starts on the first ``python`` call: most bash-only
rollouts never pay its start-up.
"""

from __future__ import annotations

import queue
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jupyter_client import KernelManager

from shared.toolserver.output import cap_text

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_INTERRUPT_GRACE_S = 5.0


@dataclass
class PythonOutcome:
    stdout: str
    stderr: str
    result: str | None
    error: str | None
    timed_out: bool = False
    restarted: bool = False

    def render(self, cap: int) -> tuple[str, bool]:
        parts = [self.stdout]
        if self.stderr:
            parts.append(self.stderr)
        if self.result is not None:
            parts.append(self.result if self.result.endswith("\n") else self.result + "\n")
        if self.error:
            parts.append(self.error)
        return cap_text("".join(parts), cap)


class PythonKernel:
    """Starts, runs code in, interrupts and stops one IPython kernel."""

    def __init__(self, cwd: Path, env: dict[str, str], state_dir: Path, transport: str = "ipc") -> None:
        self.cwd = cwd
        self.env = env
        self.state_dir = state_dir
        self.transport = transport
        self.manager: KernelManager | None = None
        self.client = None

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        ip = str(self.state_dir / "k") if self.transport == "ipc" else "127.0.0.1"
        manager = KernelManager(
            transport=self.transport,
            ip=ip,
            connection_file=str(self.state_dir / "kernel.json"),
        )
        manager.kernel_spec.argv = [  # this interpreter, never a kernel found on PATH
            sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        env = {**self.env, "IPYTHONDIR": str(self.state_dir / "ipython"), "JPY_PARENT_PID": ""}
        manager.start_kernel(
            cwd=str(self.cwd),
            env=env,
            extra_arguments=["--HistoryManager.enabled=False", "--colors=NoColor"],
        )
        client = manager.blocking_client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
        except RuntimeError:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
            raise
        self.manager, self.client = manager, client

    def close(self) -> None:
        manager, client = self.manager, self.client
        self.manager = self.client = None
        if client is not None:
            client.stop_channels()
        if manager is not None:
            try:
                manager.shutdown_kernel(now=True)
            except Exception:  # noqa: BLE001 - a dead kernel is what we want
                pass
            manager.cleanup_resources()

    def run(self, code: str, timeout: float) -> PythonOutcome:
        if self.manager is None or not self.manager.is_alive():
            self.close()
            self.start()
        assert self.client is not None and self.manager is not None
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False)
        outcome = PythonOutcome("", "", None, None)
        if self._collect(msg_id, time.monotonic() + timeout, outcome):
            self._drain_replies()
            return outcome
        outcome.timed_out = True
        self.manager.interrupt_kernel()
        if not self._collect(msg_id, time.monotonic() + _INTERRUPT_GRACE_S, outcome):
            self.close()
            self.start()
            outcome.restarted = True
        return outcome

    def _drain_replies(self) -> None:
        """Discard execute_replies: everything is taken from iopub, and unread replies would pile up."""
        assert self.client is not None
        while True:
            try:
                self.client.get_shell_msg(timeout=0)
            except queue.Empty:
                return

    def _collect(self, msg_id: str, deadline: float, outcome: PythonOutcome) -> bool:
        """Gather iopub output of one execution until the kernel is idle; False on deadline."""
        assert self.client is not None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                msg = self.client.get_iopub_msg(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content.get("name") == "stderr":
                    outcome.stderr += content.get("text", "")
                else:
                    outcome.stdout += content.get("text", "")
            elif kind in ("execute_result", "display_data"):
                text = content.get("data", {}).get("text/plain")
                if text is not None:
                    if kind == "execute_result":
                        outcome.result = text
                    else:
                        outcome.stdout += text + "\n"
            elif kind == "error":
                outcome.error = _ANSI.sub("", "\n".join(content.get("traceback", []))) + "\n"
            elif kind == "status" and content.get("execution_state") == "idle":
                return True
