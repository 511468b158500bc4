"""A worker fleet that outlives its time limit, scales both ways, and keeps its secrets, on a real Slurm.

slurm/stack.sh brings up Redis (with a password), the API and one task per stage; the rollout
stage is scaled up and down; a rollout task with a two-minute limit renews itself before the limit
(a successor is submitted and recorded, the old task drains and ends COMPLETED) while jobs keep
finishing exactly once; `status` shows no password; `down` leaves nothing queued, successors
included.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from tests.slurm.conftest import REPO, job_env
from tests.support.waiting import trace, wait_for, wait_status

PASSWORD = "s3cret-pw"


def _stack(slurm, config: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return slurm.run([str(REPO / "slurm" / "stack.sh"), *args], env={**job_env(config), **env}, timeout=300)


def _published(run_dir: Path, name: str) -> dict[str, str]:
    path = run_dir / f"{name}.env"
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _bearer(run_dir: Path) -> dict[str, str]:
    """The admin token `stack.sh up` made (the API refuses callers without one)."""
    return {"Authorization": f"Bearer {_published(run_dir, 'secrets')['ROLLOUTS_TOKEN']}"}


def _recorded(run_dir: Path, role: str) -> list[str]:
    return [line.split()[1] for line in (run_dir / "jobs").read_text().splitlines() if line.split()[0] == role]


def test_a_fleet_scales_renews_before_its_time_limit_and_hides_its_password(slurm, write_config, tmp_path, trace_dir):
    run_dir = tmp_path / "run"
    config = write_config(
        ROLLOUTS_SLURM_SBATCH_ARGS=f"--partition={slurm.partition} --time=10",
        ROLLOUTS_SLURM_REDIS_PASSWORD=PASSWORD,
        ROLLOUTS_DRAIN_TIMEOUT_S="3",
    )
    _stack(slurm, config, "up", "--init", "1", "--rollout", "1", "--eval", "1")
    try:
        api_url = wait_for(
            lambda: _published(run_dir, "api").get("ROLLOUTS_API_URL"),
            timeout=240,
            what="the API job to publish its address",
        )
        api = httpx.Client(base_url=api_url, timeout=10.0, headers=_bearer(run_dir))

        def rollout_workers() -> int:
            return api.get("/v1/status").json()["stages"]["rollout"]["processes"]

        # Scale up, then down: the surplus drains and ends on its own.
        _stack(slurm, config, "scale", "rollout", "3")
        wait_for(lambda: rollout_workers() == 3, timeout=120, what="three rollout workers")
        scaled = _stack(slurm, config, "scale", "rollout", "1")
        assert scaled.stderr.count("rollout: stopping") == 2, scaled.stderr
        wait_for(lambda: rollout_workers() == 1, timeout=120, what="one rollout worker again")

        # The status lists the jobs, the addresses and the secrets' names, never a password, token or key.
        status = _stack(slurm, config, "status").stdout
        assert PASSWORD not in status and "redis://:***@" in status and f"ROLLOUTS_API_URL={api_url}" in status
        made = {k: v for k, v in _published(run_dir, "secrets").items() if not k.startswith("#")}
        assert {"ROLLOUTS_API_TOKENS", "ROLLOUTS_BACKEND_TOKEN"} <= set(made)
        assert "ROLLOUTS_SLURM_REDIS_PASSWORD" not in made
        assert not [k for k, v in made.items() if v in status] and "ROLLOUTS_BACKEND_TOKEN=***" in status

        # A task with two minutes, warned (USR1) 100 s before its end: it submits its successor, then drains.
        before = set(_recorded(run_dir, "rollout"))
        _stack(slurm, config, "scale", "rollout", "0")
        wait_for(lambda: rollout_workers() == 0, timeout=120, what="no rollout worker")
        _stack(slurm, config, "add", "rollout", "1", ROLLOUTS_SLURM_ROLLOUT_SBATCH_ARGS="--time=2 --signal=B:USR1@100")
        short = (set(_recorded(run_dir, "rollout")) - before).pop()
        jobs = [{"task": {"kind": "scripted", "trace": str(trace_dir), "sleep": {"rollout": 1.0}}}] * 20
        ids = api.post("/v1/jobs", json=jobs[:10]).json()["job_ids"]
        successor = wait_for(
            lambda: next(iter(set(_recorded(run_dir, "rollout")) - before - {short}), None),
            timeout=150,
            what="the short task to renew itself",
        )
        ids += api.post("/v1/jobs", json=jobs[10:]).json()["job_ids"]
        wait_for(lambda: not slurm.tasks(short), timeout=120, what="the renewed task to drain and end")
        assert slurm.job_state(f"{short}_0") == "COMPLETED", "it should have drained, not been killed at its limit"
        for job_id in ids:
            assert wait_status(api, job_id, timeout=180)["status"] == "done"
            assert sum(line.startswith("eval end") for line in trace(trace_dir, job_id)) == 1
        assert successor in _stack(slurm, config, "status").stdout
    finally:
        down = _stack(slurm, config, "down")

    assert "stack stopped" in down.stderr
    recorded = [line.split()[1] for line in (run_dir / "jobs.stopped").read_text().splitlines()]
    leftover = {job: slurm.tasks(job) for job in recorded if slurm.tasks(job)}
    assert not leftover, f"still queued after down: {leftover}"
