"""One persistent bash per sandbox, on a pseudo-terminal.

Each call writes the command to a file and sources it in the long-lived shell
(``. file </dev/null``), then prints a marker with a per-call nonce and ``$?``.
Sourcing keeps cwd, variables and functions between calls, gives the exact exit
status, and lets a multi-line command or a syntax error stay one call. The
marker is read back from the pty; nothing is polled.

Timeouts and runaway output interrupt the command with the terminal's own ^C
(SIGINT to the foreground job), then SIGKILL the foreground process group, and
only if the shell itself is wedged, start a new one: the shell stays usable.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import select
import shlex
import signal
import termios
import time
from dataclasses import dataclass
from pathlib import Path

from ptyprocess import PtyProcess

from workers.toolserver.output import CappedBuffer

_MARKER = "__RO_DONE_{nonce}_%d__"
_ANY_MARKER = re.compile(rb"\r?\n__RO_DONE_[0-9a-f]{16}_\d+__\r?\n")
_INTERRUPT_GRACE_S = 3.0  # ^C to a prompt; generous, since a busy machine is slow to deliver it


@dataclass
class BashOutcome:
    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    note: str = ""


class _ShellGone(Exception):
    """The shell process exited (``exit`` was run, or it was killed)."""


def _default_interrupt_signals() -> None:
    """In the shell's child before exec: SIGINT and SIGQUIT back to their defaults.

    A process started in the background by a non-interactive shell (`rollouts worker &` in
    a batch script) inherits SIGINT and SIGQUIT ignored, and bash can neither trap nor
    reset a signal ignored on entry: ^C would then never stop a command, and every
    timeout would end in SIGKILL.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class PersistentBash:
    """A bash process on a pty that runs one command at a time."""

    def __init__(
        self,
        cwd: Path,
        env: dict[str, str],
        state_dir: Path,
        output_cap: int,
        hard_output_cap: int,
    ) -> None:
        self.cwd = cwd
        self.env = env
        self.state_dir = state_dir
        self.output_cap = output_cap
        self.hard_output_cap = max(hard_output_cap, output_cap)
        self.proc: PtyProcess | None = None
        self._pending = bytearray()

    # --- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "TERM": "dumb", "PS1": "", "PS2": "", "PROMPT_COMMAND": ""}
        self.proc = PtyProcess.spawn(
            ["bash", "--noprofile", "--norc", "--noediting", "-i"],
            cwd=str(self.cwd),
            env=env,
            echo=False,
            dimensions=(50, 250),
            preexec_fn=_default_interrupt_signals,
        )
        attrs = termios.tcgetattr(self.proc.fd)
        attrs[1] &= ~termios.ONLCR  # no \r\n translation: output is what the command wrote
        termios.tcsetattr(self.proc.fd, termios.TCSANOW, attrs)
        self._pending.clear()
        nonce = secrets.token_hex(8)
        # stty as a foreground command, so bash also saves these settings as the
        # tty state it restores after a job dies of a signal (^C)
        self._send(f"stty -echo -onlcr; unset HISTFILE; set +H +o history; {self._marker_cmd(nonce, '0')}")
        if self._wait_marker(nonce, time.monotonic() + 30, CappedBuffer(1024)) is None:
            self.close()
            raise RuntimeError("bash did not start")

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            # Reaped first, ptyprocess's close has nothing to wait for: without this it sleeps a fixed
            # 0.1 s (delayafterclose), on the ending job's slot when a reused sandbox is reset.
            deadline = time.monotonic() + 5.0
            while proc.isalive() and time.monotonic() < deadline:
                time.sleep(0.002)
            if not proc.isalive():
                proc.delayafterclose = 0
            proc.close(force=True)
        except Exception:  # noqa: BLE001, S110 - already dead is fine
            pass

    def restart(self) -> None:
        self.close()
        self.start()

    # --- one call ----------------------------------------------------------
    def run(self, command: str, timeout: float) -> BashOutcome:
        if self.proc is None or not self.proc.isalive():
            self.restart()
        script = self.state_dir / "command.sh"
        script.write_text(command + "\n")
        nonce = secrets.token_hex(8)
        sink = CappedBuffer(self.output_cap)
        deadline = time.monotonic() + timeout
        try:
            self._send(f". {shlex.quote(str(script))} </dev/null; {self._marker_cmd(nonce, '$?')}")
            code = self._wait_marker(nonce, deadline, sink, stop_at_bytes=self.hard_output_cap)
            if code is not None:
                return BashOutcome(sink.text(), code, truncated=sink.truncated)
            overflow = sink.total > self.hard_output_cap
            code, note = self._interrupt(sink, nonce)
        except _ShellGone:
            status = self._exit_status()
            self.restart()
            return BashOutcome(
                sink.text(),
                status,
                truncated=sink.truncated,
                note="[the shell exited; a new shell was started]",
            )
        if overflow:
            note = f"[output exceeded {self.hard_output_cap} bytes; the command was interrupted] " + note
            return BashOutcome(sink.text(), code, truncated=True, note=note.strip())
        note = f"[command timed out after {timeout:g}s and was interrupted] " + note
        return BashOutcome(sink.text(), code, timed_out=True, truncated=sink.truncated, note=note.strip())

    # --- internals -----------------------------------------------------------
    @staticmethod
    def _marker_cmd(nonce: str, status: str) -> str:
        return f"printf '\\n{_MARKER.format(nonce=nonce)}\\n' \"{status}\""

    def _send(self, line: str) -> None:
        assert self.proc is not None
        os.write(self.proc.fd, line.encode() + b"\n")

    def _exit_status(self) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        try:
            proc.wait()
        except Exception:  # noqa: BLE001
            return None
        if proc.exitstatus is not None:
            return proc.exitstatus
        return 128 + proc.signalstatus if proc.signalstatus else None

    def _wait_marker(
        self, nonce: str, deadline: float, sink: CappedBuffer, stop_at_bytes: int | None = None
    ) -> int | None:
        """Read into ``sink`` until this nonce's marker: its status, or None on deadline."""
        assert self.proc is not None
        pattern = re.compile(rb"\r?\n" + _MARKER.format(nonce=nonce).replace("%d", r"(\d+)").encode() + rb"\r?\n")
        keep_back = len(pattern.pattern) + 16
        own = nonce.encode()
        while True:
            if _ANY_MARKER.search(self._pending):
                # drop late duplicates from an earlier interrupt: they are not output
                self._pending[:] = _ANY_MARKER.sub(
                    lambda m: m.group(0) if own in m.group(0) else b"", bytes(self._pending)
                )
            match = pattern.search(self._pending)
            if match:
                code = int(match.group(1))
                sink.write(bytes(self._pending[: match.start()]))
                del self._pending[: match.end()]
                return code
            if len(self._pending) > keep_back:
                flush = len(self._pending) - keep_back
                sink.write(bytes(self._pending[:flush]))
                del self._pending[:flush]
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop_at_bytes is not None and sink.total > stop_at_bytes):
                return None
            ready, _, _ = select.select([self.proc.fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            try:
                chunk = os.read(self.proc.fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                sink.write(bytes(self._pending))
                self._pending.clear()
                raise _ShellGone()
            self._pending += chunk

    def _interrupt(self, sink: CappedBuffer, call_nonce: str) -> tuple[int | None, str]:
        """Stop the running command and get the shell back to a prompt.

        Returns the command's status: from its own marker if the rest of the call
        still ran after the foreground job was killed, else ``$?`` after ^C. The
        resync line is re-sent each round because bash drops input it had
        buffered when SIGINT arrives; repeated markers are stripped later.
        """
        assert self.proc is not None
        nonce = secrets.token_hex(8)
        own = re.compile("\r?\n" + _MARKER.format(nonce=call_nonce).replace("%d", r"(\d+)") + "\r?\n")
        os.write(self.proc.fd, b"\x03")
        discard = CappedBuffer(self.output_cap)
        for _ in range(4):
            self._send(self._marker_cmd(nonce, "$?"))
            code = self._wait_marker(nonce, time.monotonic() + _INTERRUPT_GRACE_S, discard)
            if code is not None:
                rest = discard.text()
                match = own.search(rest)
                if match:
                    code = int(match.group(1))
                    rest = rest[: match.start()] + rest[match.end() :]
                if not sink.truncated:
                    sink.write(rest.encode())
                return code, ""
            try:
                group = os.tcgetpgrp(self.proc.fd)
                if group != self.proc.pid:
                    os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
        self.restart()
        return None, "[the shell did not respond and was restarted; cwd and variables were reset]"
