"""A real Slurm cluster for the module, and the settings the stack's scripts get through it.

The jobs are the real slurm/*.sbatch scripts; what a site would put in its shared config file
(Redis, API, state dir, task modules, the Python to run) the tests put in one too, and pass
its path as ROLLOUTS_CONFIG, exactly as an operator does.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.slurm.cluster import SlurmCluster, missing_binaries

REPO = Path(__file__).resolve().parents[2]

# Quick recovery, so a worker that vanishes has its jobs re-queued within seconds.
FAST_SETTINGS = {
    "ROLLOUTS_TASK_MODULES": "tests.support.kinds",
    "ROLLOUTS_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_HEARTBEAT_TTL_S": "6",
    "ROLLOUTS_MAINTENANCE_INTERVAL_S": "2",
    "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_SLURM_POLL_S": "0.5",
    "ROLLOUTS_PYTHON": sys.executable,
    # The scripts advertise `hostname` by default; a CI container's name may not resolve.
    "ROLLOUTS_SLURM_ADVERTISE_HOST": "127.0.0.1",
}


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        pytest.skip(
            f"Slurm/munge not installed ({', '.join(missing)}); scripts/setup.sh test installs slurm-wlm and munge"
        )
    if os.geteuid() != 0:
        pytest.skip("a private slurmd and munged need root (munged runs as the munge user, slurmd as root)")
    # Not pytest's tmp_path: munged refuses a socket path any ancestor of which others may not enter.
    root = Path(tempfile.mkdtemp(prefix="rollouts-slurm-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root, kill_wait_s=10).start()
    yield cluster
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """Writes a ROLLOUTS_CONFIG file: the fast settings, a run dir and a state dir, plus `extra`."""

    def write(**extra: str) -> Path:
        values = {
            **FAST_SETTINGS,
            "ROLLOUTS_STATE_DIR": str(tmp_path / "state"),
            "ROLLOUTS_RUN_DIR": str(tmp_path / "run"),
            **extra,
        }
        path = tmp_path / "rollouts.env"
        path.write_text("# written by tests/slurm\n" + "".join(f"{k}={v}\n" for k, v in values.items()))
        return path

    return write


@pytest.fixture()
def trace_dir(tmp_path: Path) -> Path:
    path = tmp_path / "trace"
    path.mkdir()
    return path


def job_env(config: Path) -> dict[str, str]:
    """The environment sbatch passes on: this one minus our own ROLLOUTS_* (the file decides)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTS_")}
    return {**env, "ROLLOUTS_CONFIG": str(config), "ROLLOUTS_HOME": str(REPO)}
