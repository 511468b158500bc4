"""The unisolated fallback, for hosts where bubblewrap cannot create namespaces.

The probe is forced to fail; everything else (tool server, rlimits, uid drop,
teardown) runs for real.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.config import Settings
from shared.sandbox import SandboxError, SandboxSpec, create_sandbox, local


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
