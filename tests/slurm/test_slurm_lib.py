"""slurm/lib.sh on its own (no cluster needed): the config file's precedence and quoting, and
address files that only their owner job removes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.slurm.conftest import REPO


def _bash(script: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {REPO}/slurm/lib.sh; {script}"],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_config_file_fills_in_what_the_environment_does_not_set(tmp_path: Path):
    config = tmp_path / "rollouts.env"
    config.write_text(
        "# comment\n\n"
        "ROLLOUTS_A=from-file\n"
        'export ROLLOUTS_B="two words"\n'
        "ROLLOUTS_C='$NOT_EXPANDED'\n"
        "  ROLLOUTS_D=x=y\n"
        "not a setting\n"
    )
    out = _bash(
        'rollouts_load_env_file "$CONFIG"; printf "%s|" "$ROLLOUTS_A" "$ROLLOUTS_B" "$ROLLOUTS_C" "$ROLLOUTS_D"',
        {"CONFIG": str(config), "ROLLOUTS_A": "from-env"},
    )
    assert out == "from-env|two words|$NOT_EXPANDED|x=y|"


def test_setup_reads_the_config_and_defaults_the_run_dir_under_the_state_dir(tmp_path: Path):
    config = tmp_path / "rollouts.env"
    config.write_text(f"ROLLOUTS_STATE_DIR={tmp_path}/state\n")
    out = _bash(
        'rollouts_setup; echo "$ROLLOUTS_RUN_DIR $ROLLOUTS_PYTHON $PWD"',
        {"ROLLOUTS_CONFIG": str(config), "SLURM_SUBMIT_DIR": str(REPO)},
    )
    assert out.split() == [f"{tmp_path}/state/slurm", f"{REPO}/.venv/bin/python", str(REPO)]
    assert (tmp_path / "state" / "slurm").is_dir()


def test_an_address_file_is_private_and_removed_only_by_the_job_that_owns_it(tmp_path: Path):
    env = {"ROLLOUTS_RUN_DIR": str(tmp_path), "SLURM_JOB_ID": "11"}
    _bash("rollouts_publish api ROLLOUTS_API_URL http://a:1", env)  # exits: its trap removes the file
    assert not (tmp_path / "api.env").exists()

    # Job 12 replaced the address while job 11 still ran; job 11 exiting must leave it alone.
    _bash("rollouts_publish api ROLLOUTS_API_URL http://b:2; trap - EXIT", {**env, "SLURM_JOB_ID": "12"})
    _bash("rollouts_unpublish api", env)
    published = tmp_path / "api.env"
    assert published.read_text() == "ROLLOUTS_API_URL=http://b:2\nROLLOUTS_SLURM_API_JOB=12\n"
    assert published.stat().st_mode & 0o077 == 0
    _bash("rollouts_unpublish api", {**env, "SLURM_JOB_ID": "12"})
    assert not published.exists()


def test_a_job_waits_for_an_address_and_ignores_one_whose_job_is_gone(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"  # answers like `squeue -h -j ID -t RUNNING -o %i`: only job 12 runs
    squeue.write_text('#!/bin/bash\nfor a in "$@"; do [ "$a" = 12 ] && echo 12; done; exit 0\n')
    squeue.chmod(0o755)
    (tmp_path / "redis.env").write_text("ROLLOUTS_REDIS_URL=redis://old:1/0\nROLLOUTS_SLURM_REDIS_JOB=11\n")
    env = {
        "ROLLOUTS_RUN_DIR": str(tmp_path),
        "ROLLOUTS_SLURM_WAIT_S": "2",
        "ROLLOUTS_SLURM_POLL_S": "0.2",
        "PATH": f"{bin_dir}:/usr/bin:/bin",
    }
    script = f"source {REPO}/slurm/lib.sh; rollouts_wait_for redis ROLLOUTS_REDIS_URL; echo $ROLLOUTS_REDIS_URL"

    stale = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert stale.returncode == 3 and "gave up waiting" in stale.stderr

    (tmp_path / "redis.env").write_text("ROLLOUTS_REDIS_URL=redis://new:2/0\nROLLOUTS_SLURM_REDIS_JOB=12\n")
    live = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert live.returncode == 0 and live.stdout.strip() == "redis://new:2/0"
    configured = subprocess.run(
        ["bash", "-c", script],
        env={**env, "ROLLOUTS_REDIS_URL": "redis://site:3/0"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert configured.stdout.strip() == "redis://site:3/0"


def _settings(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and line[0] != "#")


def test_up_makes_private_secrets_once_and_every_job_reads_them(tmp_path: Path):
    env = {"ROLLOUTS_RUN_DIR": str(tmp_path), "ROLLOUTS_PYTHON": "python3", "ROLLOUTS_BACKEND_TOKEN": "from-config"}
    _bash("rollouts_make_secrets", env)
    made = _settings(tmp_path / "secrets.env")
    assert (tmp_path / "secrets.env").stat().st_mode & 0o077 == 0
    assert set(made) == {
        "ROLLOUTS_SLURM_REDIS_PASSWORD",
        "ROLLOUTS_API_TOKENS",
        "ROLLOUTS_ADMIN_TOKENS",
        "ROLLOUTS_TOKEN",
        "ROLLOUTS_BACKEND_ADMIN_TOKEN",
    }, "a configured value is not made"
    assert len(set(made.values())) == 4 and made["ROLLOUTS_TOKEN"] == made["ROLLOUTS_ADMIN_TOKENS"]
    assert all(len(value) >= 40 for value in made.values())

    _bash("rollouts_make_secrets", env)  # a second `up`: the tokens trainers hold stay valid
    assert _settings(tmp_path / "secrets.env") == made
    # Rotation: a line removed from the file is made anew; the rest stay.
    kept = [line for line in (tmp_path / "secrets.env").read_text().splitlines() if "BACKEND_ADMIN_TOKEN" not in line]
    (tmp_path / "secrets.env").write_text("\n".join(kept) + "\n")
    _bash("rollouts_make_secrets", env)
    rotated = _settings(tmp_path / "secrets.env")
    assert rotated.pop("ROLLOUTS_BACKEND_ADMIN_TOKEN") != made.pop("ROLLOUTS_BACKEND_ADMIN_TOKEN") and rotated == made
    out = _bash(
        'rollouts_setup; echo "$ROLLOUTS_API_TOKENS $ROLLOUTS_BACKEND_TOKEN"', {**env, "SLURM_SUBMIT_DIR": str(REPO)}
    )
    assert out.split() == [rotated["ROLLOUTS_API_TOKENS"], "from-config"], "the environment wins over the file"


def test_a_deployments_gateway_keys_from_before_the_rename_become_its_tokens(tmp_path: Path):
    """A secrets file written when the gateways' secrets were called keys: its values are carried over as the
    tokens, so the gateways already running (holding the old values) keep opening to the workers and the API."""
    (tmp_path / "secrets.env").write_text("ROLLOUTS_BACKEND_KEY=old-data\nROLLOUTS_BACKEND_ADMIN_KEY=old-admin\n")
    (tmp_path / "secrets.env").chmod(0o600)
    _bash("rollouts_make_secrets", {"ROLLOUTS_RUN_DIR": str(tmp_path), "ROLLOUTS_PYTHON": "python3"})
    made = _settings(tmp_path / "secrets.env")
    assert (made["ROLLOUTS_BACKEND_TOKEN"], made["ROLLOUTS_BACKEND_ADMIN_TOKEN"]) == ("old-data", "old-admin")


def test_a_site_redis_gets_no_password_made(tmp_path: Path):
    _bash(
        "rollouts_make_secrets",
        {
            "ROLLOUTS_RUN_DIR": str(tmp_path),
            "ROLLOUTS_PYTHON": "python3",
            "ROLLOUTS_REDIS_URL": "redis://:site@redis:6379/0",
        },
    )
    assert "ROLLOUTS_SLURM_REDIS_PASSWORD" not in _settings(tmp_path / "secrets.env")


def test_redaction_hides_every_secret_value_and_keeps_the_rest():
    lines = [
        "ROLLOUTS_REDIS_URL=redis://:pw@node:6379/0",
        "ROLLOUTS_API_TOKENS=a,b",
        "ROLLOUTS_TOKEN=t",
        "ROLLOUTS_BACKEND_ADMIN_TOKEN=k",
        "ROLLOUTS_SLURM_REDIS_PASSWORD=p",
        "ROLLOUTS_API_URL=http://node:8000",
    ]
    out = _bash(" ".join(f"rollouts_redact '{line}';" for line in lines), {})
    assert out.splitlines() == [
        "ROLLOUTS_REDIS_URL=redis://:***@node:6379/0",
        "ROLLOUTS_API_TOKENS=***",
        "ROLLOUTS_TOKEN=***",
        "ROLLOUTS_BACKEND_ADMIN_TOKEN=***",
        "ROLLOUTS_SLURM_REDIS_PASSWORD=***",
        "ROLLOUTS_API_URL=http://node:8000",
    ]
