"""The Sandbox every stage uses; backends only say how to wrap a command.

A backend turns an argv into the argv that runs it isolated (``wrap``), and
may prepare and release host resources around that. Everything else (tool
server start-up, tool calls, one-shot commands, teardown) is here, once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from shared.config import Settings
from shared.errors import RolloutsError
from workers.sandbox.host_processes import kill_group, read_capped, spawn
from workers.sandbox.isolation import rlimit_preexec
from workers.sandbox.owner import sandbox_id_of
from workers.sandbox.quota import DiskQuota, QuotaWatch
from workers.sandbox.spec import ExecResult, SandboxSpec
from workers.sandbox.start_gate import start_gate
from workers.toolserver.client import ToolClient, ToolServerError
from workers.toolserver.result import ToolResult

log = logging.getLogger("rollouts.sandbox")

SOCKET_NAME = "tools.sock"
SCRATCH_NAME = "tmp"  # the sandbox's /tmp, on disk in the runtime dir, inside the disk quota
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes; the kernel's ipc sockets add a suffix


class SandboxError(RolloutsError, RuntimeError):
    """The sandbox could not start or died: an infrastructure failure, not the agent's."""


class SandboxDiskQuotaExceeded(SandboxError):
    """The sandbox wrote more than its disk quota and was ended: a limit, never a reward."""


class Sandbox(ABC):
    """One job's sandbox: a tool server for the agent, and one-shot commands for init and eval.

    ``workspace`` is the job's directory on shared storage (it appears at
    ``workdir`` inside); ``runtime_dir`` is a node-local directory this object
    owns for the socket, the tool server's state and the sandbox's /tmp
    (``scratch_dir``), removed by ``stop()``. While a sandbox process runs, a
    ``QuotaWatch`` bounds what the workspace and the runtime dir hold together.
    """

    backend: str = "abstract"

    def __init__(self, spec: SandboxSpec, workspace: Path, runtime_dir: Path, settings: Settings) -> None:
        self.spec = spec
        self.settings = settings
        self.workspace = Path(os.path.realpath(workspace))
        self.runtime_dir = Path(os.path.abspath(runtime_dir))
        self.limits = spec.limits.resolved(settings)
        self.socket_path = self.runtime_dir / SOCKET_NAME
        self.scratch_dir = self.runtime_dir / SCRATCH_NAME
        disk_bytes = self.limits.disk_bytes or settings.sandbox_disk_bytes
        self.quota = DiskQuota(max_bytes=disk_bytes, max_files=settings.sandbox_disk_files)
        self._proc: subprocess.Popen[bytes] | None = None
        self._live: set[subprocess.Popen[bytes]] = set()  # what the quota watch ends when it fires
        self._live_lock = threading.Lock()
        self._over_quota: str | None = None  # why the quota ended this sandbox; it stays ended
        self._watch: QuotaWatch | None = None
        self._watch_users = 0
        self._start_watched = False  # start() holds one use of the watch until stop()
        self._watch_lock = threading.Lock()
        self._quota_ended = threading.Event()  # set once an over-quota sandbox's processes are all gone
        self._client: ToolClient | None = None
        # What the sandbox's own in-memory trees held while it was known clean (reset.py proves a reuse by it).
        self.clean_fingerprint: frozenset[tuple[str, int, int]] | None = None
        # The kernel fork server (host pid, start ticks, limits, nice) the last warm-up left, before any job ran.
        self.clean_fork_server: tuple[int, int, str, str] | None = None
        self._created_runtime = False
        # stop() may race itself (a cancel from the API thread, the rollout's own teardown,
        # __del__): one stopper at a time, the others find nothing left to do.
        self._stop_lock = threading.Lock()
        if len(str(self.socket_path)) > _MAX_SOCKET_PATH - 20:
            raise SandboxError(f"runtime dir {self.runtime_dir} is too long for a Unix socket path")

    # --- what a backend provides --------------------------------------------
    @property
    @abstractmethod
    def workdir(self) -> str:
        """The workspace's path as commands inside the sandbox see it."""

    @abstractmethod
    def wrap(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """The host argv that runs ``argv`` inside the sandbox with ``env``."""

    toolserver_python: str  # the interpreter that runs the tool server inside the sandbox

    def toolserver_argv(self) -> list[str]:
        """How to start ``python -m workers.toolserver`` inside the sandbox."""
        s = self.settings
        return [
            self.toolserver_python,
            "-m",
            "workers.toolserver",
            "--socket",
            str(self.socket_path),
            "--workspace",
            self.workdir,
            "--state-dir",
            str(self.runtime_dir / "toolserver"),
            "--output-cap",
            str(s.tool_output_cap_bytes),
            "--hard-output-cap",
            str(s.tool_hard_output_bytes),
            "--default-timeout",
            str(s.tool_default_timeout_s),
            "--max-timeout",
            str(s.tool_max_timeout_s),
        ]

    @property
    def launcher_reaps(self) -> bool:
        """Whether the launched process exits, after its tree is gone, once its init is killed."""
        return True

    def _acquire(self) -> None:  # noqa: B027 - an optional hook
        """Reserve host resources (uids, images) before the first process starts."""

    def _release(self) -> None:  # noqa: B027 - an optional hook
        """Give back what ``_acquire`` took."""

    def _preexec(self) -> Any:
        return rlimit_preexec(self.limits)

    # --- environment --------------------------------------------------------
    def base_env(self) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        env.update(self.spec.env)
        return env

    # --- lifecycle ----------------------------------------------------------
    def _ensure_runtime_dir(self) -> None:
        if not self.runtime_dir.exists():
            self.runtime_dir.mkdir(parents=True, mode=0o700)
            self._created_runtime = True
        if not self.scratch_dir.exists():
            self.scratch_dir.mkdir(mode=0o700)
            self.scratch_dir.chmod(0o1777)  # /tmp's mode; mkdir's is cut by the umask

    # --- disk quota ---------------------------------------------------------
    def _watch_begin(self) -> None:
        """Start measuring (one watch however many processes run); raise if already over."""
        with self._watch_lock:
            self._watch_users += 1
            if self._watch is None:
                roots = [self.workspace, self.runtime_dir]
                interval = self.settings.sandbox_disk_check_interval_s
                self._watch = QuotaWatch(roots, self.quota, interval, self._end_over_quota)
                reason = self._watch.check()
                if reason is None:
                    self._watch.start()
        self._raise_if_over_quota()

    def _watch_end(self) -> None:
        with self._watch_lock:
            self._watch_users -= 1
            watch = self._watch if self._watch_users == 0 else None
            if watch is not None:
                self._watch = None
        if watch is not None:
            watch.stop()
            if watch.reason is not None:
                self._over_quota = watch.reason

    def _quota_reason(self) -> str | None:
        watch = self._watch
        return (watch.reason if watch is not None else None) or self._over_quota

    def _raise_if_over_quota(self) -> None:
        reason = self._quota_reason()
        if reason is not None:
            self._quota_ended.wait(30.0)  # the watch is still killing: raise once nothing is left writing
            raise SandboxDiskQuotaExceeded(f"sandbox ended for writing too much: {reason}")

    def _end_over_quota(self, reason: str) -> None:
        """SIGKILL every process of this sandbox and wait until they are gone (their owners' waits
        then return; ``stop()`` later finds nothing left)."""
        with self._live_lock:
            self._over_quota = reason
            live = list(self._live)
        try:
            for proc in live:
                kill_group(proc, self.launcher_reaps)
        finally:
            self._quota_ended.set()

    def _track(self, proc: subprocess.Popen[bytes]) -> None:
        """Put a new sandbox process in the quota watch's reach (killed at once if already over)."""
        with self._live_lock:
            self._live.add(proc)
            over = self._over_quota is not None
        if over:
            kill_group(proc, self.launcher_reaps)

    def start(self, spare: bool = False) -> Sandbox:
        """Start the sandbox and its tool server; returns once the server answers.

        At most ``sandbox_start_concurrency`` starts run at once in this process (and per image):
        a start beyond that waits for a turn (``start_gate.py``); a ``spare`` one (the pool's) lets
        every waiting job's start go first."""
        if self._proc is not None:
            return self
        self._ensure_runtime_dir()
        with start_gate(self.settings).turn(self.spec.image or self.backend, spare):  # waits its turn, never fails
            return self._start()

    def _start(self) -> Sandbox:
        log_path = self.runtime_dir / "toolserver.log"
        try:
            self._acquire()
            self._start_watched = True
            self._watch_begin()
            argv = self.wrap(self.toolserver_argv(), self.base_env())
            log.debug("starting sandbox: %s", shlex.join(argv))
            with open(log_path, "ab") as log_file:
                self._proc = spawn(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=self._preexec(),
                    close_fds=True,
                )
            self._track(self._proc)
            self._client = ToolClient(self.socket_path)
            proc = self._proc
            self._client.wait_ready(self.settings.sandbox_start_timeout_s, alive=lambda: proc.poll() is None)
        except SandboxError:
            self.stop()
            raise
        except (ToolServerError, OSError) as exc:
            detail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
            self.stop()
            raise SandboxError(f"{self.backend} sandbox failed to start: {exc}\n{detail}") from exc
        return self

    def call(self, tool: str, args: dict[str, Any], timeout: float | None = None) -> ToolResult:
        """Run one tool call. Bad calls come back as error observations, never exceptions.

        Raises SandboxError only when the sandbox itself is gone.
        """
        if self._client is None:
            raise SandboxError("sandbox is not started")
        self._raise_if_over_quota()
        try:
            return self._client.call(tool, args, timeout, max_timeout=self.settings.tool_max_timeout_s)
        except ToolServerError as exc:
            self._raise_if_over_quota()
            alive = self._proc is not None and self._proc.poll() is None
            raise SandboxError(f"tool server failed ({'running' if alive else 'exited'}): {exc}") from exc

    def exec(
        self,
        command: str | list[str],
        timeout: float,
        env: dict[str, str] | None = None,
        output_cap: int | None = None,
    ) -> ExecResult:
        """Run one command to completion in a fresh sandbox process over the same workspace.

        A string runs under ``bash -c`` in the workspace. Works whether or not
        ``start()`` was called (init and eval need no tool server). Raises
        SandboxDiskQuotaExceeded when the sandbox wrote past its disk quota.
        """
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        cap = output_cap or self.settings.tool_output_cap_bytes * 4
        self._ensure_runtime_dir()
        owns_resources = self._proc is None
        if owns_resources:
            self._acquire()
        started = time.monotonic()
        try:
            self._watch_begin()
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                proc = spawn(
                    self.wrap(argv, {**self.base_env(), **(env or {})}),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    preexec_fn=self._preexec(),
                    close_fds=True,
                )
                self._track(proc)
                timed_out = False
                try:
                    code: int | None = proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    kill_group(proc, self.launcher_reaps)
                    code = None
                finally:
                    with self._live_lock:
                        self._live.discard(proc)
                stdout, cut_out = read_capped(out, cap)
                stderr, cut_err = read_capped(err, cap)
            self._raise_if_over_quota()
        finally:
            self._watch_end()
            if owns_resources:
                self._release()
        return ExecResult(
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=cut_out or cut_err,
            duration_s=time.monotonic() - started,
        )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def sandbox_id(self) -> str:
        """What the job's record names (``sandboxes``), so an operator can join a sandbox found on a node to
        its rollout: ``<host>-<pid>.<start>-<random>`` for a rollout's (owner.py), whose runtime dir, named
        in its processes' argv (the tool server's socket), is ``<tmp>/ro-<pid>.<start>-<random>``."""
        return sandbox_id_of(self.runtime_dir)

    # --- what a pool needs (workers/sandbox/pool.py, handoff.py, reset.py) ---
    @property
    def launcher_pid(self) -> int | None:
        """The host pid of the process this sandbox was launched as (bwrap, the network launcher)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def scratch_inside(self) -> str:
        """The sandbox's /tmp as its own processes name it."""
        return "/tmp"

    @property
    def host_binds(self) -> list[Path]:
        """Host paths bound at the same path inside: where one lies under the host's /tmp (the node's temp
        dir; a CI clone, a scratch venv), its first directory there is a mount point in the sandbox's /tmp."""
        return [self.runtime_dir]

    @property
    def over_quota(self) -> str | None:
        """Why the disk quota ended this sandbox, or None."""
        return self._quota_reason()

    @property
    def poolable(self) -> str | None:
        """Why this sandbox cannot be pooled (started ahead of its job), or None when it can."""
        return None

    def control(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request to the tool server other than a tool call (``warm``, ``reset``); SandboxError if it
        cannot be made or is refused."""
        if self._client is None:
            raise SandboxError("sandbox is not started")
        try:
            reply = self._client.request(message, timeout)
        except ToolServerError as exc:
            raise SandboxError(f"tool server failed: {exc}") from exc
        if not reply.get("ok"):
            raise SandboxError(f"tool server refused {message.get('op')}: {reply.get('error')}")
        return reply

    def rebind_workspace(self, path: Path) -> None:
        """The host path of the directory bound at ``workdir`` changed (the pool renamed it): measure the disk
        quota there from now on, in a fresh walk, and give it to the sandbox's user."""
        if self._start_watched:
            self._watch_end()
        self.workspace = Path(os.path.realpath(path))
        self._own_workspace()
        if self._start_watched:
            self._watch_begin()

    def _own_workspace(self) -> None:  # noqa: B027 - an optional hook
        """Give the workspace's files to the sandbox's user, where it has one of its own."""

    def stop(self) -> None:
        """Stop the tool server and every process of this sandbox; idempotent.

        Only this sandbox's own process tree is signalled (its session, and the
        pid namespace the backend put it in), never processes found by name.
        Thread-safe: concurrent calls serialise, and only the first does the work
        (so a uid slot's lock fd is closed once, never a reused fd).
        """
        with self._stop_lock:
            client, self._client = self._client, None
            proc, self._proc = self._proc, None
            if proc is not None:
                with self._live_lock:
                    self._live.discard(proc)
                # No graceful shutdown first: if the tool server exited on its own,
                # bwrap would return before its init had reaped the rest of the tree.
                # Killing first also ends a call another thread is blocked in.
                kill_group(proc, self.launcher_reaps)
            if client is not None:
                client.close()
            if self._start_watched:
                self._start_watched = False
                self._watch_end()
            self._release()
            if self._created_runtime:
                shutil.rmtree(self.runtime_dir, ignore_errors=True)
                self._created_runtime = False

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        if getattr(self, "_proc", None) is not None:
            with contextlib.suppress(Exception):  # best effort at interpreter exit
                self.stop()
