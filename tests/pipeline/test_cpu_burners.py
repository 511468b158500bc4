"""CPU burners beside the pipeline (issue 19, items 8 and 9): no false "worker died", every job done.

Two `while True: pass` processes (as many as this machine's cores) run beside a real stack whose
heartbeats are the tests' shortest (1 s, abandoned after 6 s without one: FAST_RECOVERY_ENV), while
jobs that each hold a rollout slot across several heartbeat intervals go through. A heartbeat thread
starved long enough would make rq's maintenance think the worker died and re-run the stage (a `lost`
entry, a second attempt) or leave a failed-registry entry. Nothing here depends on how fast the
machine is: the jobs' deadlines are far away and only outcomes are asserted.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import TERMINAL, client_for, wait_for

JOBS = 12
HOLD_S = 8.0  # each rollout spans 8 heartbeat intervals, longer than the 6 s TTL
BURN = "while True: pass"


@pytest.fixture()
def burners() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two CPU burners at normal priority, killed (by their own pid) at the end."""
    procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(2)]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_burning_cpus_make_no_worker_look_dead(make_stack, burners, tmp_path: Path) -> None:
    stack = make_stack(concurrency={"init": 2, "rollout": JOBS, "eval": 2})
    api = client_for(stack)
    body = [{"task": {"kind": "scripted", "sleep": {"rollout": HOLD_S}, "reward": 0.25}} for _ in range(JOBS)]
    job_ids = api.post("/v1/jobs", json=body).json()["job_ids"]
    assert all(proc.poll() is None for proc in burners), "the burners must burn throughout"

    def all_terminal() -> list[dict] | None:
        records = [api.get(f"/v1/jobs/{job_id}").json() for job_id in job_ids]
        return records if all(r["status"] in TERMINAL for r in records) else None

    records = wait_for(all_terminal, timeout=600, interval=1.0, what="every job to end beside the burners")
    assert all(proc.poll() is None for proc in burners)
    for record in records:
        assert record["status"] == "done", record
        assert record["result"]["reward"] == 0.25
        assert record["lost"] == {}, f"a stage was re-run as if its worker had died: {record['lost']}"
        assert set(record["attempts"].values()) == {1}, record["attempts"]
    stages = api.get("/v1/status").json()["stages"]
    assert all(stages[stage]["failed"] == 0 for stage in stages), stages
    logs = "".join(path.read_text(errors="replace") for path in (tmp_path / "logs").glob("*.log"))
    assert "slots on queue" in logs, "the workers' logs were read"
    assert "worker lost" not in logs and "re-queued" not in logs
