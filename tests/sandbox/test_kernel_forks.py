"""The sandbox's kernel fork server: kernels are forks of one pre-imported process, fresh each time,
out of each other's and the job's reach."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.sandbox import Sandbox
from workers.toolserver.kernel_forks import ForkServerError
from workers.toolserver.python import PythonKernel
from workers.toolserver.reaper import alive


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[PythonKernel]:
    k = PythonKernel(tmp_path, {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}, tmp_path / "state")
    k.start()
    yield k
    k.close()


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_every_kernel_is_a_fresh_fork_of_the_one_fork_server(kernel: PythonKernel) -> None:
    fork_server = kernel.forks.pid()
    assert fork_server is not None and kernel.pid is not None and _parent_of(kernel.pid) == fork_server
    kernel.run("import json; state = 'old'", 30)
    first = kernel.pid
    kernel.close_kernel()
    assert not alive(first)
    kernel.start()
    assert kernel.forks.pid() == fork_server and kernel.pid != first and _parent_of(kernel.pid) == fork_server
    assert kernel.run("'state' in globals()", 30).result == "False"
    assert kernel.run("import os; os.getcwd()", 30).result == repr(str(kernel.cwd))
    # the kernel's environment is the one asked for, not the fork server's or the host's
    assert kernel.run("sorted(k for k in os.environ if k in ('PATH', 'HOME', 'IPYTHONDIR'))", 30).result == (
        "['HOME', 'IPYTHONDIR', 'PATH']"
    )


def test_a_kernel_shares_no_socket_with_the_fork_server(kernel: PythonKernel) -> None:
    """Job code in a kernel cannot ask the fork server for anything (kernels, signals to other kernels)."""
    assert kernel.pid is not None and kernel.forks.proc is not None
    server_fds = {os.readlink(f) for f in Path(f"/proc/{kernel.forks.proc.pid}/fd").iterdir()}
    kernel_fds = {os.readlink(f) for f in Path(f"/proc/{kernel.pid}/fd").iterdir()}
    shared_sockets = {link for link in server_fds & kernel_fds if link.startswith("socket:")}
    assert not shared_sockets, shared_sockets


@pytest.mark.usefixtures("require_bwrap")
def test_in_a_sandbox_job_code_cannot_write_into_the_fork_server(sandbox: Sandbox) -> None:
    """The fork server outlives a reused sandbox's jobs and every later kernel copies its memory:
    it is not dumpable, so the sandbox's user cannot open its /proc/<pid>/mem (ptrace is refused too)."""
    code = "import os; open(f'/proc/{os.getppid()}/mem', 'r+b')"
    out = sandbox.call("python", {"code": code})
    assert out.is_error and "PermissionError" in out.output, out
    assert sandbox.call("python", {"code": "open('/proc/self/mem', 'rb').close(); 'own memory'"}).output == (
        "'own memory'\n"
    )


def test_a_killed_fork_server_is_replaced_at_the_next_start(kernel: PythonKernel) -> None:
    old = kernel.forks.pid()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    kernel.forks.proc.wait()  # type: ignore[union-attr]
    # its kernel lost its parent; the next call finds the kernel alive or restarts it, never hangs
    assert kernel.run("1 + 1", 30).result == "2"
    kernel.close_kernel()
    kernel.start()
    assert kernel.forks.pid() not in (None, old)
    assert kernel.run("2 + 2", 30).result == "4"


def test_a_kernel_that_exits_is_reported_dead_and_restarted(kernel: PythonKernel) -> None:
    kernel.run("kept = 1", 30)
    out = kernel.run("import os; os._exit(3)", 30)
    assert out.died and out.restarted and "kernel died" in (out.error or ""), out
    assert kernel.run("'kept' in globals()", 30).result == "False"


def test_a_fork_server_that_stops_answering_is_stopped_not_misread_later(kernel: PythonKernel) -> None:
    """An answer that comes late would be taken for the next request's: a request not answered in time stops
    the fork server (and its kernels), and the next start brings up a new one."""
    stuck = kernel.forks.pid()
    assert stuck is not None and kernel.pid is not None
    os.kill(stuck, signal.SIGSTOP)
    with pytest.raises(ForkServerError, match="stopped answering"):
        kernel.forks.spawn(["-f", "unused.json"], kernel.cwd, {}, timeout=0.5)
    assert not kernel.forks.running and not alive(stuck)
    assert kernel.run("1 + 1", 30).result == "2"  # its kernel went with it: restarted from a new fork server
    assert kernel.forks.pid() not in (None, stuck)
