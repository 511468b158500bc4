"""slurm/stack.sh as an operator runs it: Redis, the API, the stage arrays and a model backend as
jobs with dependencies, a batch through them, a weight update, scaling up, and an ordered shutdown.

The vLLM job runs the real slurm/vllm.sbatch: vLLM's CPU build serving the tiny model on loopback
behind its node gateway, bound to this machine's non-loopback address, so its
serve/wait/register/heartbeat/deregister path and a weight update run under Slurm as on a GPU
cluster. No secret is configured: the stack makes its own, and what a cluster neighbour would try
(no token, no key, the data token on a control route, vLLM's own port) is refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from cli.embedded_redis import free_port
from tests.slurm.conftest import REPO, job_env
from tests.support.addresses import node_address, refuses
from tests.support.vllm_server import SERVED_NAME, TEST_VLLM_ARGS
from tests.support.waiting import trace, wait_for, wait_status
from tests.support.weight_checks import checkpoint, gap_to, sample


def _stack(slurm, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return slurm.run([str(REPO / "slurm" / "stack.sh"), *args], env=job_env(config), timeout=300)


def _published(run_dir: Path, name: str) -> dict[str, str]:
    path = run_dir / f"{name}.env"
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _backends(api: httpx.Client) -> list[dict]:
    return api.get("/v1/backends").json()["backends"]


def _vllm_pid(port: int) -> int:
    """The vLLM API server listening on `port` (its command line names the port)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        serves = b"vllm.entrypoints.openai.api_server" in argv and b"--port" in argv
        if serves and argv[argv.index(b"--port") + 1] == str(port).encode():
            return int(proc.name)
    raise AssertionError(f"no vLLM server on port {port}")


@pytest.mark.vllm
def test_stack_script_runs_a_batch_scales_up_and_stops_in_order(
    slurm, write_config, tmp_path, trace_dir, tiny_model, figure
):
    run_dir, node, vllm_port, checkpoints = tmp_path / "run", node_address(), free_port(), tmp_path / "checkpoints"
    checkpoints.mkdir()
    config = write_config(
        ROLLOUTS_SLURM_SBATCH_ARGS=f"--partition={slurm.partition} --time=10",
        ROLLOUTS_SLURM_VLLM_SBATCH_ARGS="--gres=none --cpus-per-task=1",  # no GPUs here
        ROLLOUTS_VLLM_MODEL=str(tiny_model),
        ROLLOUTS_VLLM_SERVED_MODEL_NAME="tiny",
        ROLLOUTS_VLLM_ARGS=" ".join([*TEST_VLLM_ARGS, "--max-model-len", "4096"]),
        ROLLOUTS_VLLM_PORT=str(vllm_port),
        ROLLOUTS_GATEWAY_BIND=node,
        ROLLOUTS_CHECKPOINT_ROOTS=str(checkpoints),
        ROLLOUTS_DRAIN_TIMEOUT_S="3",
    )
    _stack(slurm, config, "up", "--init", "1", "--rollout", "1", "--eval", "1", "--vllm", "1")
    roles = dict(line.split() for line in (run_dir / "jobs").read_text().splitlines())
    assert set(roles) == {"redis", "api", "init", "rollout", "eval", "vllm"}
    secrets = _published(run_dir, "secrets")
    assert (run_dir / "secrets.env").stat().st_mode & 0o077 == 0, "the secrets file is readable by others"
    added = new_api = None
    try:
        api_url = wait_for(
            lambda: _published(run_dir, "api").get("ROLLOUTS_API_URL"),
            timeout=90,
            what="the API job to publish its address",
        )
        password = secrets["ROLLOUTS_SLURM_REDIS_PASSWORD"]
        assert _published(run_dir, "redis")["ROLLOUTS_REDIS_URL"].startswith(f"redis://:{password}@")
        assert (run_dir / "redis.env").stat().st_mode & 0o077 == 0, "the password file is readable by others"
        assert httpx.get(f"{api_url}/v1/jobs", timeout=10).status_code == 401, "the API answers without a token"
        api = httpx.Client(
            base_url=api_url, timeout=10.0, headers={"Authorization": f"Bearer {secrets['ROLLOUTS_TOKEN']}"}
        )

        backend = wait_for(
            lambda: next((b for b in _backends(api) if b["healthy"]), None),
            timeout=900,
            what="the vLLM job's backend to register",
        )
        assert backend["model"] == "tiny" and backend["labels"]["slurm_job"].startswith(roles["vllm"])
        gateway = backend["url"]
        assert gateway.startswith(f"http://{node}:"), f"the pool knows {gateway}, not the node gateway"

        # What a cluster neighbour would try, each refused; vLLM itself answers on loopback only.
        assert refuses(node, vllm_port) and not refuses("127.0.0.1", vllm_port)
        assert httpx.post(f"{gateway}/pause", timeout=10).status_code == 401
        data_token = {"Authorization": f"Bearer {secrets['ROLLOUTS_BACKEND_TOKEN']}"}
        assert httpx.post(f"{gateway}/pause", headers=data_token, timeout=10).status_code == 403

        # A weight update through the API reaches the Slurm-launched backend through its gateway.
        step = checkpoint(checkpoints, seed=1)
        outside = api.post(
            f"/v1/models/{SERVED_NAME}/weights", json={"version": "step-x", "path": str(tiny_model)}, timeout=300
        )
        assert outside.status_code == 422 and "outside the checkpoint roots" in outside.text, outside.text
        update = api.post(
            f"/v1/models/{SERVED_NAME}/weights", json={"version": "step-1", "path": str(step)}, timeout=300
        )
        assert update.status_code == 200, update.text
        assert [b["status"] for b in update.json()["backends"]] == ["updated"], update.text
        tokens, logprobs = sample(gateway, 5, secrets["ROLLOUTS_BACKEND_TOKEN"])
        assert gap_to(step, tokens, logprobs) < 1e-3 < gap_to(tiny_model, tokens, logprobs)

        # vLLM dies (its API server SIGKILLed): the job restarts it in place, its registration follows, and
        # the API loads the current weights into it before the pool routes to it again.
        killed = time.monotonic()
        os.kill(_vllm_pid(vllm_port), signal.SIGKILL)
        wait_for(lambda: not any(b["healthy"] for b in _backends(api)), timeout=60, what="the dead backend to leave")
        left = time.monotonic() - killed
        back = wait_for(
            lambda: next((b for b in _backends(api) if b["healthy"]), None),
            timeout=600,
            what="the restarted backend to rejoin the pool",
        )
        figure(
            f"vLLM SIGKILLed under Slurm after update step-1: out of the pool {left:.1f} s after the kill, "
            f"back behind its gateway with step-1 {time.monotonic() - killed:.1f} s after"
        )
        assert back["url"] == gateway
        info = httpx.get(f"{gateway}/weight_info", headers=data_token, timeout=10).json()
        assert info["weight_version"] == "step-1", info
        tokens, logprobs = sample(gateway, 5, secrets["ROLLOUTS_BACKEND_TOKEN"])
        assert gap_to(step, tokens, logprobs) < 1e-3 < gap_to(tiny_model, tokens, logprobs)
        vllm_log = next((run_dir / "logs").glob(f"rollouts-vllm-{roles['vllm']}_0.log")).read_text()
        assert "vLLM exited (code" in vllm_log and "restarting it on port" in vllm_log

        _stack(slurm, config, "add", "rollout", "2")  # scale up: another array
        added = (run_dir / "jobs").read_text().splitlines()[-1].split()[1]
        wait_for(lambda: list(slurm.tasks(added).values()) == ["RUNNING"] * 2, timeout=60, what="the added tasks")
        wait_for(
            lambda: api.get("/v1/status").json()["stages"]["rollout"]["processes"] == 3,
            timeout=90,
            what="three rollout workers",
        )

        status = _stack(slurm, config, "status").stdout
        assert f"ROLLOUTS_API_URL={api_url}" in status and not [v for v in secrets.values() if v in status]
        assert all(
            any(line.startswith(role) and "_" in line for line in status.splitlines()) for role in ("init", "vllm")
        )

        jobs = [{"task": {"kind": "scripted", "trace": str(trace_dir), "sleep": {"rollout": 0.5}}}] * 6
        ids = api.post("/v1/jobs", json=jobs).json()["job_ids"]
        for job_id in ids:
            assert wait_status(api, job_id, timeout=90)["status"] == "done"
            assert sum(line.startswith("eval end") for line in trace(trace_dir, job_id)) == 1

        # The backend job's batch shell gets SIGTERM (time limit, `stack.sh down`): it deregisters
        # before stopping its server, so the pool forgets it at once instead of marking it unhealthy.
        slurm.run(["scancel", "--batch", "--signal=TERM", roles["vllm"]])
        wait_for(lambda: not _backends(api), timeout=30, what="the backend to deregister")
        wait_for(lambda: not slurm.tasks(roles["vllm"]), timeout=30, what="the vLLM job to end")
        assert slurm.job_state(f"{roles['vllm']}_0") == "COMPLETED"

        # Replacing the API (an upgrade): the new job takes over api.env; the old one, cancelled,
        # leaves the new address alone.
        _stack(slurm, config, "add", "api")
        new_api = (run_dir / "jobs").read_text().splitlines()[-1].split()[1]
        wait_for(
            lambda: _published(run_dir, "api").get("ROLLOUTS_SLURM_API_JOB") == new_api,
            timeout=60,
            what="the new API to publish its address",
        )
        slurm.run(["scancel", roles["api"]])
        wait_for(lambda: not slurm.tasks(roles["api"]), timeout=30, what="the old API to end")
        assert _published(run_dir, "api")["ROLLOUTS_SLURM_API_JOB"] == new_api
        api = httpx.Client(base_url=_published(run_dir, "api")["ROLLOUTS_API_URL"], timeout=10.0, headers=api.headers)
        assert wait_status(api, ids[0])["status"] == "done"
    finally:
        down = _stack(slurm, config, "down")

    assert "stack stopped" in down.stderr
    for job_id in [*roles.values(), added, new_api]:
        assert job_id is not None
        assert not slurm.tasks(job_id), f"job {job_id} still queued after down"
    assert not (run_dir / "api.env").exists() and not (run_dir / "redis.env").exists()
    assert list((run_dir / "redis").glob("appendonly*")), "Redis kept no data on shared storage"
    leaked = [log.name for log in (run_dir / "logs").iterdir() if any(v in log.read_text() for v in secrets.values())]
    assert not leaked, f"a secret is in the logs: {leaked}"
