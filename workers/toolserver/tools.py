"""Dispatch of validated tool calls to bash, the kernel and the file tools."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.tool_schemas import validate_call
from workers.toolserver.bash import PersistentBash
from workers.toolserver.files import ToolError, Workspace
from workers.toolserver.output import cap_text
from workers.toolserver.python import PythonKernel
from workers.toolserver.reaper import kept_state
from workers.toolserver.result import ToolResult


@dataclass
class ToolLimits:
    output_cap: int = 16 * 1024
    hard_output_cap: int = 8 * 1024 * 1024
    default_timeout_s: float = 60.0
    max_timeout_s: float = 600.0


class ToolBox:
    """The tools of one sandbox. Calls to one tool are serialised by its lock."""

    def __init__(self, workspace: Path, state_dir: Path, env: dict[str, str], limits: ToolLimits) -> None:
        self.limits = limits
        self.state_dir = state_dir
        self.workspace = Workspace(workspace)
        self.bash = PersistentBash(workspace, env, state_dir / "bash", limits.output_cap, limits.hard_output_cap)
        self.python = PythonKernel(
            workspace,
            env,
            state_dir / "python",
            output_cap=limits.output_cap,
            hard_output_cap=limits.hard_output_cap,
        )
        self._locks = {"bash": threading.Lock(), "python": threading.Lock(), "files": threading.Lock()}
        self._clean_fork_server: tuple[int, int, str, str] | None = None

    def start(self) -> None:
        self.bash.start()

    def warm(self, python: bool) -> None:
        """Have the shell (and, for kinds that use ``python``, the kernel) up before a job's first call."""
        with self._locks["bash"]:
            if self.bash.proc is None or not self.bash.proc.isalive():
                self.bash.restart()
        if python:
            with self._locks["python"]:
                if not self.python.started:
                    self.python.start()
        # Only a pool warms, when the sandbox has started or was reset: no job's code has run since.
        self._clean_fork_server = self._fork_server_state()

    def locks(self) -> list[threading.Lock]:
        """Every tool's lock, in one order (a reset holds them all)."""
        return [self._locks[name] for name in ("bash", "python", "files")]

    def close(self, keep_fork_server: bool = False) -> None:
        """Stop the shell and the kernel; the kernel fork server too, unless a reset keeps it for the next job."""
        self.bash.close()
        if keep_fork_server:
            self.python.close_kernel()
        else:
            self.python.close()

    def fork_server_pid(self) -> int | None:
        """The kernel fork server's pid while it runs."""
        return self.python.forks.pid()

    def fork_server_to_keep(self) -> int | None:
        """The fork server a reset may keep for the next job: the one the last warm-up found (started before
        any job's code ran: not one a job had restarted), with the same limits and priority (a job may
        lower both for a process of its user, and every later kernel would inherit them), not stopped."""
        state = self._fork_server_state()
        return state[0] if state is not None and state == self._clean_fork_server else None

    def _fork_server_state(self) -> tuple[int, int, str, str] | None:
        pid = self.fork_server_pid()
        state = kept_state(pid) if pid is not None else None
        return (pid, *state) if pid is not None and state is not None else None

    def child_pids(self) -> set[int]:
        """The server's own children (the shell, the kernel fork server): their owners wait for them."""
        pids = set()
        proc = self.bash.proc
        if proc is not None:
            pids.add(proc.pid)
        fork_server = self.fork_server_pid()
        if fork_server is not None:
            pids.add(fork_server)
        return pids

    def _timeout(self, args: dict[str, Any], requested: float | None) -> float:
        """The call's timeout: the tool's ``timeout`` argument, else the request's, else the default.

        None, zero, negative and non-finite values (NaN parses from JSON and passes the
        schema's ``number``) all mean the default: a NaN deadline never compares as
        passed, so the shell would never be interrupted.
        """
        value = args.get("timeout", requested)
        try:
            value = float(value) if value is not None else None
        except (TypeError, ValueError):
            value = None
        if value is None or not math.isfinite(value) or value <= 0:
            value = self.limits.default_timeout_s
        return min(value, self.limits.max_timeout_s)

    def call(self, tool: Any, args: Any, timeout: float | None = None) -> ToolResult:
        started = time.monotonic()
        problem = validate_call(tool, args)
        if problem is not None:
            result = ToolResult.error(problem)
        else:
            try:
                result = self._dispatch(tool, args, timeout)
            except ToolError as exc:
                result = ToolResult.error(str(exc))
            except Exception as exc:  # noqa: BLE001 - the agent sees it, the server lives on
                result = ToolResult.error(f"{tool} failed: {type(exc).__name__}: {exc}")
        result.duration_s = time.monotonic() - started
        return result

    def _dispatch(self, tool: str, args: dict[str, Any], timeout: float | None) -> ToolResult:
        cap = self.limits.output_cap
        if tool == "bash":
            with self._locks["bash"]:
                out = self.bash.run(args["command"], self._timeout(args, timeout))
            text = out.output
            if out.note:
                text += ("" if not text or text.endswith("\n") else "\n") + out.note + "\n"
            return ToolResult(
                output=text,
                is_error=out.timed_out,
                exit_code=out.exit_code,
                truncated=out.truncated,
                timed_out=out.timed_out,
            )
        if tool == "python":
            with self._locks["python"]:
                out = self.python.run(args["code"], self._timeout(args, timeout))
            text, truncated = out.render(cap)
            if out.overflowed:
                text += f"[output exceeded {self.limits.hard_output_cap} bytes; the execution was interrupted"
                text += "; the kernel was restarted and its state lost]\n" if out.restarted else "]\n"
            elif out.timed_out:
                text += "[execution timed out and was interrupted"
                text += "; the kernel was restarted and its state lost]\n" if out.restarted else "]\n"
            return ToolResult(
                output=text,
                is_error=out.error is not None or out.timed_out or out.overflowed,
                truncated=truncated or out.overflowed,
                timed_out=out.timed_out,
            )
        if tool == "finish":
            return ToolResult(output=args.get("answer", ""), finished=True)
        with self._locks["files"]:
            if tool == "view":
                text = self.workspace.view(args["path"], args.get("view_range"))
            elif tool == "create":
                text = self.workspace.create(args["path"], args["file_text"])
            else:
                text = self.workspace.str_replace(args["path"], args["old_str"], args.get("new_str", ""))
        text, truncated = cap_text(text, cap)
        return ToolResult(output=text, truncated=truncated)
