"""The project's shape is checked, not hoped for: import-linter's contracts in pyproject.toml.

Layers point down only (benches, CLI, then the API and the workers, then shared/); inside
workers/ the kinds sit over the stage libraries; the API, shared/ (the task kinds' specs) and the
CLI's task commands import no worker code; the API's routers import neither redis nor the key names;
the client imports nothing from the server; no two sibling modules import each other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")])}
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout
    assert result.stdout.count("KEPT") == 6, result.stdout
