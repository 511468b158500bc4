"""The unisolated fallback, for hosts where bubblewrap cannot create namespaces.

The probe is forced to fail; everything else (tool server, rlimits, uid drop,
teardown) runs for real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shared.config import Settings
from workers.sandbox import SandboxError, SandboxSpec, create_sandbox, local
from workers.toolserver.client import ToolClient


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit is reaped by pid 1, not by us)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture()
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "bwrap_usable", lambda: (False, "forced by the test"))


def test_required_isolation_refuses_the_fallback(
    no_bwrap: None, workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> None:
    with pytest.raises(SandboxError, match="forced by the test"):
        create_sandbox(SandboxSpec(), workspace, short_dir / "rt", sandbox_settings)


def test_fallback_runs_tools_with_limits_and_cleans_up(
    no_bwrap: None, workspace: Path, short_dir: Path, sandbox_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    settings = sandbox_settings.model_copy(update={"sandbox_require_isolation": False})
    box = create_sandbox(SandboxSpec(limits={"processes": 48}), workspace, short_dir / "rt", settings)
    assert "UNISOLATED" in caplog.text and box.workdir == str(workspace)
    with box:
        result = box.call("bash", {"command": "pwd; ulimit -u; id -u; sleep 1000 & echo $! > bg.pid"})
        cwd, nproc, uid = result.output.split()
        assert (cwd, nproc) == (str(workspace), "48")
        assert uid == str(os.geteuid())  # unisolated: the worker's own uid
        background = int((workspace / "bg.pid").read_text())
        assert box.call("python", {"code": "import os; os.getcwd()"}).output == f"'{workspace}'\n"
    assert not _running(background)
    assert not (short_dir / "rt").exists()


def _wait_for_pid_file(path: Path) -> int:
    for _ in range(1000):
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        threading.Event().wait(0.01)
    raise AssertionError(f"{path} never appeared")


def _is_descendant(pid: int, root: int) -> bool:
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except FileNotFoundError:
            return False
        if pid == root:
            return True
    return False


def test_fallback_kills_daemonised_processes(
    no_bwrap: None, workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> None:
    """setsid and double-forked processes are orphans: without a subreaper they would go to the
    host's init and outlive the sandbox."""
    settings = sandbox_settings.model_copy(update={"sandbox_require_isolation": False})
    box = create_sandbox(SandboxSpec(), workspace, short_dir / "rt", settings)
    with box:
        server = box._proc.pid  # type: ignore[union-attr]
        command = (
            "setsid bash -c 'echo $$ > sid.pid; exec sleep 1001' </dev/null >/dev/null 2>&1 & "
            "( bash -c 'echo $$ > df.pid; exec sleep 1002' </dev/null >/dev/null 2>&1 & ) ; "
            "nohup bash -c '( bash -c \"echo \\$\\$ > deep.pid; exec sleep 1003\" & ) ; exit 0' >/dev/null 2>&1 &"
        )
        assert box.call("bash", {"command": command}).exit_code == 0
        daemons = [_wait_for_pid_file(workspace / name) for name in ("sid.pid", "df.pid", "deep.pid")]
        for pid in daemons:
            assert _running(pid)
            for _ in range(1000):  # the intermediate parents exit: orphans re-parent to the server
                if _is_descendant(pid, server):
                    break
                threading.Event().wait(0.01)
            assert _is_descendant(pid, server), f"daemon {pid} left the sandbox's process tree"
    for pid in daemons:
        assert not _running(pid), f"daemon {pid} outlived the sandbox"


def test_tool_server_shutdown_kills_daemons_and_reaps_orphans(tmp_path: Path, short_dir: Path) -> None:
    """The server itself, asked to shut down, kills what the agent daemonised."""
    ws = tmp_path / "ws"
    ws.mkdir()
    sock = short_dir / "t.sock"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.toolserver",
            "--socket",
            str(sock),
            "--workspace",
            str(ws),
            "--state-dir",
            str(short_dir / "state"),
        ],
        cwd=Path(__file__).resolve().parents[2],
        start_new_session=True,
    )
    try:
        client = ToolClient(sock)
        client.wait_ready(60, alive=lambda: server.poll() is None)
        short_lived = "( bash -c 'echo $$ > gone.pid; exit 0' & ) ; sleep 0.1"
        assert client.call("bash", {"command": short_lived}).exit_code == 0
        gone = _wait_for_pid_file(ws / "gone.pid")
        for _ in range(2000):  # an exited orphan is reaped, not left as the server's zombie
            if not os.path.exists(f"/proc/{gone}"):
                break
            threading.Event().wait(0.01)
        assert not os.path.exists(f"/proc/{gone}")
        daemon = "setsid bash -c 'echo $$ > d.pid; exec sleep 1004' </dev/null >/dev/null 2>&1 &"
        assert client.call("bash", {"command": daemon}).exit_code == 0
        pid = _wait_for_pid_file(ws / "d.pid")
        assert _running(pid)
        client.shutdown()
        assert server.wait(60) == 0
        assert not _running(pid)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_fallback_scratch_is_home_and_tmpdir_inside_the_quota(
    no_bwrap: None, workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> None:
    """Without a /tmp of its own, the fallback's $HOME and $TMPDIR are its scratch dir (counted by the
    disk quota); a task's own env still wins."""
    settings = sandbox_settings.model_copy(update={"sandbox_require_isolation": False})
    box = create_sandbox(SandboxSpec(env={"HOME": "/elsewhere"}), workspace, short_dir / "rt", settings)
    try:
        command = 'echo "$HOME $TMPDIR"; python3 -c "import tempfile; print(tempfile.gettempdir())"'
        result = box.exec(command, timeout=30)
        assert result.stdout.split() == ["/elsewhere", str(box.scratch_dir), str(box.scratch_dir)]
    finally:
        box.stop()
