"""The trainer's own engines in the pool (`engines: trainer`), against a real vLLM: registered by the bridge,
routed to, labelled with the trainer's step, judged by max_staleness as in the service-owned mode, and gone
at shutdown (or out of selection by heartbeat expiry after a crash).

The stack has no backend of its own: every job can only run on the "trainer-owned" server, the session's
vLLM reached through a HoldingProxy (so a test can hold a job between two turns while the trainer declares
a new step). The trainer's weight loading itself is not repeated here (tests/weights covers in-place loads);
what the service must do in this mode is label, route, judge and forget, and that is what is checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from cli.vllm_server import VLLMServer
from rollouts_client.trainers.engines import TrainerEngines
from shared.backend_pool import backend_id_for
from shared.config import Settings
from tests.support.holding_proxy import HoldingProxy
from tests.support.trainers_env import SKYRL_PYTHONS
from tests.support.vllm_server import SERVED_NAME
from tests.support.waiting import client_for, wait_for, wait_status
from tests.trainers.conftest import run_driver
from tests.trainers.test_verl_agent_loop import agent_loops, parity, row

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ENV = {
    "ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds",
    "ROLLOUTS_MAINTENANCE_INTERVAL_S": "1",
    "ROLLOUTS_LLM_HEARTBEAT_TIMEOUT_S": "3",
}
LABELS = {"owner": "trainer", "trainer": "skyrl", "run_id": "run-a"}
TASK = {"kind": "agent-answer", "problem": "Count to ten.", "answer": "x", "stop_on_no_tool_call": False}


@dataclass
class Owned:
    proxy: HoldingProxy
    stack: Stack
    api: httpx.Client
    model_dir: Path

    def engines(self, run_id: str = "run-a") -> TrainerEngines:
        return TrainerEngines(
            [self.proxy.url], SERVED_NAME, trainer="skyrl", run_id=run_id, api_url=self.stack.api_url, heartbeat_s=0.5
        )

    def backends(self) -> list[dict[str, Any]]:
        return self.api.get("/v1/backends").json()["backends"]


@pytest.fixture(scope="module")
def owned(vllm_server: VLLMServer, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Owned]:
    root = tmp_path_factory.mktemp("engines")
    proxy = HoldingProxy(vllm_server.url).start()
    stack = Stack(
        Settings(redis_url=None, state_dir=root / "state"),
        api_port=0,
        log_dir=root / "logs",
        concurrency={"init": 1, "rollout": 2, "eval": 1},
        extra_env=ENV,
    )
    try:
        stack.start()
        stack.wait_for_workers()
        yield Owned(proxy, stack, client_for(stack), tiny_model)
    finally:
        stack.stop(timeout=20)
        proxy.stop()


def assistant_turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in record["result"]["trajectory"]["turns"] if t["role"] == "assistant"]


def test_jobs_run_on_the_trainers_server_and_record_its_step_and_shutdown_deregisters(owned: Owned) -> None:
    with owned.engines() as engines:
        [view] = owned.backends()
        assert view["url"] == owned.proxy.url and view["labels"] == LABELS and view["healthy"], view
        assert engines.declare(3)["seq"] == 1
        assert engines.declare(3) is None  # unchanged: nothing sent
        response = owned.api.post(
            "/v1/jobs",
            json={
                "task": TASK,
                "model": SERVED_NAME,
                "limits": {"max_turns": 2},
                "sampling": {"max_tokens": 8, "temperature": 1.0, "seed": 3},
            },
        )
        assert response.status_code == 202, response.text
        [job_id] = response.json()["job_ids"]
        record = wait_status(owned.api, job_id, timeout=300)
        assert record["status"] == "done", record
        turns = assistant_turns(record)
        assert turns and all(t["backend_id"] == view["id"] for t in turns), turns
        assert {t["policy_version"] for t in turns} == {"step-3"}, turns
        assert {s["version"] for t in turns for s in t["weight_versions"]} == {"step-3"}, turns
        assert owned.api.get(f"/v1/backends/{view['id']}").json()["weight_version"] == "step-3"
    assert owned.backends() == []


def test_max_staleness_judges_the_trainers_steps_as_it_judges_service_updates(owned: Owned) -> None:
    """A job straddles a step: its first turn is sampled at step-4, its later calls after the trainer declared
    step-5; at max_staleness 0 it is stale, as a job straddling a service weight update is (tests/weights)."""
    with owned.engines() as engines:
        engines.declare(4)
        owned.proxy.hold_after(1)
        try:
            response = owned.api.post(
                "/v1/batches",
                json={
                    "prompts": [TASK],
                    "n_samples": 1,
                    "max_staleness": 0,
                    "limits": {"max_turns": 3},
                    "sampling": {"max_tokens": 16, "temperature": 1.0, "seed": 7},
                },
            )
            assert response.status_code == 202, response.text
            batch = response.json()
            assert owned.proxy.held.wait(300), "the job's second model call never came"
            engines.declare(5)
        finally:
            owned.proxy.release()
        done = wait_for(
            lambda: (b := owned.api.get(f"/v1/batches/{batch['id']}").json())["status"] != "running" and b,
            timeout=300,
            what="the batch to end",
        )
        assert done["counts"]["stale"] == 1 and done["counts"]["used"] == 0, done
        [summary] = owned.api.get("/v1/jobs", params={"group_id": f"b.{batch['id']}.0"}).json()["jobs"]
        turns = assistant_turns(wait_status(owned.api, summary["id"]))
        assert len(turns) >= 2 and turns[0]["policy_version"] == "step-4", turns
        # the held call was labelled when it was sent (step-4: older, never newer, than what sampled it)
        assert {t["policy_version"] for t in turns} <= {"step-4", "step-5"}, turns
        assert len(turns) < 3 or turns[-1]["policy_version"] == "step-5", turns
        with pytest.raises(Exception, match="only move forward"):
            engines.declare(4)  # the trainer's steps never go back


def test_a_crashed_trainers_servers_leave_selection_by_heartbeat_expiry(owned: Owned) -> None:
    engines = owned.engines("run-crashed").start()
    try:
        engines.stopped.set()  # the trainer dies: no more beats, no deregistration
        assert engines.thread is not None
        engines.thread.join(10)
        [view] = wait_for(
            lambda: [b for b in owned.backends() if not b["healthy"]] or None, timeout=120, what="heartbeat expiry"
        )
        assert view["unhealthy_reason"].startswith("missed heartbeats"), view
    finally:
        engines.close()
    assert owned.backends() == []


@pytest.mark.parametrize("skyrl", sorted(SKYRL_PYTHONS))
def test_skyrls_generator_registers_skyrls_servers_stamps_its_step_and_deregisters_at_exit(
    owned: Owned, tmp_path: Path, skyrl: str
) -> None:
    task = {"rollouts_task": {"kind": "agent-parity", "problem": "x?", "stop_on_no_tool_call": False, "max_turns": 2}}
    run_id = f"skyrl-owned-{skyrl}"
    settings = {"engines": "trainer", "engine_urls": [owned.proxy.url], "model": SERVED_NAME, "run_id": run_id}
    batches = {
        "owned": {
            "rows": [{"instance_id": "x", "repetition_id": r, "env_extras": task} for r in range(2)],
            "global_step": 6,
            "settings": settings,
        }
    }
    out = run_driver(
        "skyrl_driver.py", owned.model_dir, batches, owned.stack.api_url, tmp_path, SKYRL_PYTHONS[skyrl]()
    )["owned"]
    assert "error" not in out and out["skyrl"].startswith(skyrl), out
    for job_id in out["generated"]["job_ids"]:
        record = owned.api.get(f"/v1/jobs/{job_id}").json()
        assert record["request"]["metadata"]["policy_version"] == "step-6", record["request"]
        assert {t["policy_version"] for t in assistant_turns(record)} == {"step-6"}
    assert owned.backends() == []  # the driver's exit deregistered SkyRL's server
    assert owned.api.get(f"/v1/models/{SERVED_NAME}/weights").json()["path"] == f"trainer:{run_id}"


def test_verls_agent_loop_registers_verls_servers_and_deregisters_at_exit(owned: Owned, tmp_path: Path) -> None:
    """verl's own AgentLoopWorker runs the loop with `engines: trainer`. verl 0.9.1 gives run() no step
    without a rollout-trace backend (none is installed here), so nothing is declared: the jobs carry no
    policy version of the trainer's (docs/TRAINERS.md), and still run on verl's server only."""
    loops = agent_loops(
        tmp_path, "engines", engines="trainer", model=SERVED_NAME, engine_urls=[owned.proxy.url], run_id="verl-owned"
    )
    batches = {"owned": {"rows": [row(0, "p0", parity("2+2?"))], "loops": loops}}
    out = run_driver("verl_driver.py", owned.model_dir, batches, owned.stack.api_url, tmp_path)["owned"]
    assert "error" not in out, out
    [job_id] = out["extra"]["rollouts_job_id"]
    record = owned.api.get(f"/v1/jobs/{job_id}").json()
    assert record["request"]["metadata"]["policy_version"] is None, record["request"]
    assert {t["backend_id"] for t in assistant_turns(record)} == {backend_id_for(owned.proxy.url)}
    assert owned.backends() == []  # the driver's exit deregistered verl's server


def test_verls_manager_registers_verls_servers_declares_the_batchs_step_and_deregisters_at_exit(
    owned: Owned, tmp_path: Path
) -> None:
    """verl V1's agent-loop manager with `engines: trainer`: before its one submission it registers verl's server
    and declares the weights verl's servers hold for the batch's step (V1: step k samples with version k - 1);
    every turn records it, and V1's staleness tags carry it."""
    loops = agent_loops(
        tmp_path, "manager-engines", engines="trainer", model=SERVED_NAME, engine_urls=[owned.proxy.url]
    )
    given = {
        "env": {"ROLLOUTS_RUN_ID": "verl-manager-owned"},
        "loops": loops,
        # step 11 declares step-10: past every version this module's stack declared before (they only move forward)
        "steps": [{"name": "owned", "global_steps": 11, "rows": [row(0, "mo-0", parity("2+2?"))]}],
    }
    out = run_driver("verl_manager_driver.py", owned.model_dir, given, owned.stack.api_url, tmp_path)
    stored = out["owned"]
    assert "error" not in stored and stored["submissions"] == [2], stored  # rollout.n = 2 sessions, one request
    assert stored["keys"] == ["mo-0_0_0", "mo-0_1_0"], stored["keys"]
    for extra in stored["extra"]:
        assert (extra["min_global_steps"], extra["max_global_steps"]) == (10, 10), extra
        record = owned.api.get(f"/v1/jobs/{extra['rollouts_job_id']}").json()
        turns = assistant_turns(record)
        assert {t["policy_version"] for t in turns} == {"step-10"}, turns
        assert {t["backend_id"] for t in turns} == {backend_id_for(owned.proxy.url)}, turns
    assert owned.backends() == []  # the driver's exit deregistered verl's server
    assert owned.api.get(f"/v1/models/{SERVED_NAME}/weights").json()["path"] == "trainer:verl-manager-owned"
