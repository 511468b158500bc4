"""Where the trainers' own virtualenv is (verl, SkyRL, TRL: too heavy for the project's), for the tests and benches
that run a trainer's driver in it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def trainers_python() -> Path:
    """The trainers' virtualenv's python; missing fails the test in CI (`scripts/setup.sh test` builds it) and skips elsewhere."""
    root = Path(
        os.environ.get("ROLLOUTS_TRAINERS_ENV")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollouts" / "trainers"
    )
    python = root / "bin" / "python"
    if not python.exists():
        message = f"the trainers' virtualenv is not at {root}: run scripts/setup.sh test"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python
