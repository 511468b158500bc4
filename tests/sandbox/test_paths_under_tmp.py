"""A project or virtualenv that lives under the host's /tmp (a CI clone) must stay visible in the sandbox."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from workers.sandbox.local import bwrap_command, bwrap_usable


def test_paths_under_tmp_are_bound_after_the_private_tmp(tmp_path: Path):
    ok, reason = bwrap_usable()
    if not ok:
        pytest.skip(reason)
    code = tmp_path / "checkout"
    code.mkdir()
    (code / "marker.txt").write_text("visible\n")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    runtime = tmp_path / "rt"
    runtime.mkdir()
    (runtime / "tmp").mkdir()
    argv = bwrap_command(
        ["cat", str(code / "marker.txt")],
        env={"PATH": "/usr/bin:/bin"},
        workspace=workspace,
        workdir="/workspace",
        runtime_dir=runtime,
        network=False,
        uid=None,
        ro_paths=[str(code)],
        scratch_dir=runtime / "tmp",
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "visible\n"
