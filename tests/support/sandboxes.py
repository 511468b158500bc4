"""A real sandbox for tests that run tools: bubblewrap when it can run here, else the plain-process fallback."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shared.config import Settings
from workers.sandbox import Sandbox, SandboxSpec, create_sandbox
from workers.sandbox.local import bwrap_usable


@contextmanager
def running_sandbox(tmp_path: Path, prefix: str) -> Iterator[Sandbox]:
    """A started sandbox on a workspace under `tmp_path`, stopped on exit.

    Its runtime directory sits in a short `mkdtemp(prefix=prefix)` path, not under `tmp_path`:
    the tool server's Unix socket lives there, and a socket path is limited to 108 bytes.
    """
    short = Path(tempfile.mkdtemp(prefix=prefix))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings(state_dir=tmp_path / "state", sandbox_require_isolation=bwrap_usable()[0])
    box = create_sandbox(SandboxSpec(), workspace, short / "rt", settings)
    try:
        box.start()
        yield box
    finally:
        box.stop()
        shutil.rmtree(short, ignore_errors=True)
