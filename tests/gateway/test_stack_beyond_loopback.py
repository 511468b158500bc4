"""`rollouts up` asked to listen beyond loopback: its backend on loopback is registered behind a node
gateway on the API's address, with keys made for the stack, and jobs run through it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from cli.stack import Stack
from cli.vllm_server import VLLMServer
from shared.config import Settings
from tests.support.addresses import node_address, refuses
from tests.support.waiting import wait_status

pytestmark = pytest.mark.vllm

TOKENS = {
    "ROLLOUTS_API_TOKENS": "trainer-token",
    "ROLLOUTS_ADMIN_TOKENS": "admin-token",
    "ROLLOUTS_TOKEN": "admin-token",
}
ENV = {"ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds", "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "1", **TOKENS}


def test_a_stack_beyond_loopback_reaches_its_loopback_backend_through_a_gateway(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    node = node_address()
    env = {**ENV, "ROLLOUTS_API_HOST": node}
    settings = Settings(
        redis_url=None,
        state_dir=tmp_path / "state",
        api_host=node,
        api_tokens=["trainer-token"],
        admin_tokens=["admin-token"],
        token="admin-token",
    )
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": 1, "rollout": 1, "eval": 1},
        log_dir=tmp_path / "logs",
        backend_urls=[vllm_server.url],
        extra_env=env,
    )
    with stack:
        stack.wait_for_workers()
        api = httpx.Client(base_url=stack.api_url, timeout=10, headers={"Authorization": "Bearer trainer-token"})
        [backend] = api.get("/v1/backends").json()["backends"]
        gateway = stack.registered_url(vllm_server.url)
        assert backend["url"] == gateway and gateway.startswith(f"http://{node}:"), backend
        assert refuses(node, int(vllm_server.url.rsplit(":", 1)[1])), "vLLM itself answers on the node's address"
        assert httpx.get(f"{gateway}/v1/models", timeout=10).status_code == 401
        data_token = stack.extra_env["ROLLOUTS_BACKEND_TOKEN"]
        assert data_token != stack.extra_env["ROLLOUTS_BACKEND_ADMIN_TOKEN"]
        answer = httpx.post(f"{gateway}/pause", headers={"Authorization": f"Bearer {data_token}"}, timeout=10)
        assert answer.status_code == 403, answer.text

        job = {
            "task": {"kind": "agent-answer", "problem": "What is 2 + 2?", "answer": "4"},
            "sampling": {"max_tokens": 8, "seed": 1},
            "limits": {"max_turns": 2},
        }
        [job_id] = api.post("/v1/jobs", json=job).json()["job_ids"]
        record = wait_status(api, job_id, timeout=300)
        assert record["status"] == "done", record.get("error")
        assert record["result"]["trajectory"]["turns"], "no model call went through the gateway"
