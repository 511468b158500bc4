"""Where the trainers' own virtualenvs are (verl, SkyRL: too heavy for the project's), for the tests and benches
that run a trainer's driver in one.

Two are built by `scripts/setup.sh test`: `trainers` (Python 3.11: verl, TransferQueue, SkyRL 0.3.0, the oldest
SkyRL of the client's range) and `skyrl-newest` (Python 3.13 from scripts/newer_python.sh: the newest SkyRL of the
range, which declares Python >= 3.12).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def venv_python(name: str, env_var: str) -> Path:
    """The python of the virtualenv $env_var, else ~/.cache/rollouts/<name>; missing fails the test in CI
    (`scripts/setup.sh test` builds it) and skips elsewhere."""
    root = Path(
        os.environ.get(env_var) or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollouts" / name
    )
    python = root / "bin" / "python"
    if not python.exists():
        message = f"the virtualenv {name} is not at {root}: run scripts/setup.sh test"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


def trainers_python() -> Path:
    """verl, TransferQueue and SkyRL 0.3.0 on Python 3.11."""
    return venv_python("trainers", "ROLLOUTS_TRAINERS_ENV")


def skyrl_newest_python() -> Path:
    """The newest SkyRL of the client's range (0.4.x) on Python 3.13."""
    return venv_python("skyrl-newest", "ROLLOUTS_SKYRL_NEWEST_ENV")


def nemo_gym_python() -> Path:
    """NeMo Gym 0.4.x (the client's `nemo-gym` extra) on Python 3.13 (nemo-gym declares >= 3.12;
    scripts/nemo-gym-requirements.txt)."""
    return venv_python("nemo-gym", "ROLLOUTS_NEMO_GYM_ENV")


# Each end of the client's `skyrl>=0.3,<0.5`: the version its driver must find, and the virtualenv that has it.
SKYRL_PYTHONS = {"0.3.0": trainers_python, "0.4": skyrl_newest_python}
