"""examples/verl/run_grpo.sh, run as a user runs it, with its trainer call checked by verl's own code: a `python`
shim on PATH hands the Hydra overrides the script passes to verl_example_driver.py in the trainers' virtualenv,
which composes verl's ppo_trainer config from them and runs the validation verl's `main_ppo` starts with. verl
0.9.1 refused the script as it was (no micro-batch sizes), on any hardware, before any worker started."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.trainers_env import REPO, trainers_python

MANAGER = "rollouts_client.trainers.verl_manager.RolloutsAgentLoopManager"


def _shim(bin_dir: Path, out: Path) -> None:
    """`python -m verl.trainer.main_ppo ARGS` -> the driver on ARGS; any other `python` call is the test's failure."""
    bin_dir.mkdir()
    shim = bin_dir / "python"
    driver = REPO / "tests" / "trainers" / "verl_example_driver.py"
    shim.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1 $2" != "-m verl.trainer.main_ppo" ]; then echo "unexpected python call: $*" >&2; exit 97; fi\n'
        f'shift 2; exec {trainers_python()} {driver} {out} "$@"\n'
    )
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("bridge", ["loop", "manager"])
def test_run_grpo_passes_verls_own_config_validation(bridge: str, tmp_path: Path, tiny_model: Path) -> None:
    out, rows = tmp_path / "verdict.json", tmp_path / "rows"
    _shim(tmp_path / "bin", out)
    rows.mkdir()
    (rows / "train.parquet").touch()  # the script writes rows only when there are none (examples/verl/make_rows.py)
    environment = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO / "client"),
        "ROLLOUTS_API_URL": "http://127.0.0.1:9",
        "MODEL": str(tiny_model),
        "ROWS": str(rows),
        "BRIDGE": bridge,
    }
    environment.pop("VIRTUAL_ENV", None)
    ran = subprocess.run(
        ["bash", str(REPO / "examples" / "verl" / "run_grpo.sh")],
        env=environment,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0 and out.exists(), ran.stderr[-3000:]
    verdict = json.loads(out.read_text())
    assert verdict["valid"], verdict["error"]
    assert verdict["use_v1"] and verdict["default_agent_loop"] == "rollouts"
    assert verdict["manager"] == (MANAGER if bridge == "manager" else None)
