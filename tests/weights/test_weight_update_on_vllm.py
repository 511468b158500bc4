"""A weight update through the service against a real vLLM server (not the session's: the update changes it).

One module-scoped stack (as `rollouts up --backend-url` runs it) in front of the suite's
`weights_vllm_server`, whose base weights the module restores as it ends (test_weight_upload_on_vllm.py
uses the same fixture, with a stack of its own); the tests run in order and each leaves the server on the
version it applied. Checkpoints are the tiny model with
other seeds; the logprobs the server reports are compared with transformers' on the same tokens.
The pool reaches the server through a HoldingProxy, so a test that needs a job between two of its
turns holds it there instead of racing the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cli.stack import Stack
from cli.vllm_server import VLLMServer
from shared.config import Settings
from tests.support.broken_weights_backend import BrokenWeightsBackend
from tests.support.holding_proxy import HoldingProxy
from tests.support.vllm_server import SERVED_NAME, restore_base_weights
from tests.support.waiting import client_for, wait_for, wait_status
from tests.support.weight_checks import checkpoint, gap_to, sample

pytestmark = pytest.mark.vllm

ENV = {
    "ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds",
    "ROLLOUTS_MAINTENANCE_INTERVAL_S": "1",
    "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "1",
}


@dataclass
class Served:
    """The vLLM server (`url`: what the tests sample from directly), the proxy the pool knows it by, the stack."""

    url: str
    proxy: HoldingProxy
    stack: Stack
    root: Path


@pytest.fixture(scope="module")
def served(weights_vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A fresh stack (its own Redis: no version applied yet) before the shared server, whose base weights
    come back as the module ends."""
    root = tmp_path_factory.mktemp("weights")
    server = weights_vllm_server
    proxy = HoldingProxy(server.url).start()
    stack = Stack(
        Settings(redis_url=None, state_dir=root / "state"),
        api_port=0,
        log_dir=root / "logs",
        concurrency={"init": 1, "rollout": 2, "eval": 1},
        backend_urls=[proxy.url],
        extra_env=ENV,
    )
    try:
        stack.start()
        stack.wait_for_workers()
        yield Served(server.url, proxy, stack, root)
    finally:
        stack.stop(timeout=20)
        proxy.stop()
        restore_base_weights(server)


def prefix_hits(url: str) -> float:
    """Prompt tokens vLLM found in its prefix cache so far (its own counter, GET /metrics)."""
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:prefix_cache_hits_total"))


def update(api: httpx.Client, version: str, path: Path | str, **extra: object) -> httpx.Response:
    return api.post(
        f"/v1/models/{SERVED_NAME}/weights", json={"version": version, "path": str(path), **extra}, timeout=300
    )


def applied(response: httpx.Response) -> dict:
    """The answer of an update that every backend took; anything else fails the test with the body."""
    assert response.status_code == 200, response.text
    result = response.json()
    assert all(b["status"] == "updated" for b in result["backends"]), result
    return result


def test_an_update_serves_the_new_weights_from_a_reset_cache_under_the_new_version(served) -> None:
    url, root = served.url, served.root
    api = client_for(served.stack)
    sample(url, seed=3)  # cache the prompt under the weights before the update
    result = applied(update(api, "step-1", checkpoint(root, 1)))
    [backend] = result["backends"]
    assert (result["version"], result["seq"], backend["status"]) == ("step-1", 1, "updated"), result
    assert list(backend["seconds"]) == ["pause", "reload", "reset_prefix_cache", "set_version", "resume"]
    assert httpx.get(f"{url}/weight_info").json()["weight_version"] == "step-1"
    hits = prefix_hits(url)
    tokens, logprobs = sample(url, seed=4)
    assert prefix_hits(url) == hits, "the prompt's KV from before the update was found in the cache"
    assert gap_to(checkpoint(root, 1), tokens, logprobs) < 1e-3
    sample(url, seed=5)
    assert prefix_hits(url) > hits, "the control: a repeated prompt does hit the cache"
    # a job run after the update records the new version in every assistant turn
    job = {
        "task": {"kind": "agent-answer", "problem": "What is 2 + 2?", "answer": "4", "stop_on_no_tool_call": False},
        "limits": {"max_turns": 2},
        "sampling": {"max_tokens": 24, "temperature": 1.0, "seed": 5},
    }
    [job_id] = api.post("/v1/jobs", json=[job]).json()["job_ids"]
    record = wait_status(api, job_id, timeout=300)
    assert record["status"] == "done", record.get("error")
    turns = [t for t in record["result"]["trajectory"]["turns"] if t["role"] == "assistant"]
    assert turns and all(t["policy_version"] == "step-1" for t in turns)
    assert all({s["version"] for s in t["weight_versions"]} == {"step-1"} for t in turns)


def test_bad_checkpoints_and_a_backwards_version_are_refused_and_serving_goes_on(served) -> None:
    url, root = served.url, served.root
    api = client_for(served.stack)
    assert applied(update(api, "step-2", checkpoint(root, 2)))["seq"] == 2
    refusals = [
        (update(api, "step-3", root / "missing"), "body.path"),
        (update(api, "step-3", checkpoint(root, 3, intermediate=256)), "body.path"),  # shapes do not fit
        (update(api, "step-1", checkpoint(root, 1)), "body.version"),  # step-2 came after it
    ]
    for response, field in refusals:
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["field"] == field, response.text
    assert "mlp" in refusals[1][0].json()["detail"]  # names a tensor whose shape differs
    current = api.get(f"/v1/models/{SERVED_NAME}/weights").json()
    assert (current["version"], current["seq"]) == ("step-2", 2), current  # a refused update takes no number
    [backend] = api.get("/v1/backends").json()["backends"]
    assert backend["healthy"], backend
    tokens, logprobs = sample(url, seed=6)
    assert gap_to(checkpoint(root, 2), tokens, logprobs) < 1e-3  # still step-2's weights, and serving
    assert applied(update(api, "step-2", checkpoint(root, 2)))["seq"] == 2  # re-applying the current one: a retry


def test_a_trajectory_older_than_max_staleness_is_not_admitted(served) -> None:
    """A job straddles an update: its first turn's version is one update behind at max_staleness 0.

    The proxy holds the job's second model call until the update has landed, so the first turn is
    sampled by step-2 and every later one by step-4 however fast the model writes.
    """
    api = client_for(served.stack)
    step_4 = checkpoint(served.root, 4)
    task = {"kind": "agent-answer", "problem": "Count to ten.", "answer": "x", "stop_on_no_tool_call": False}
    served.proxy.hold_after(1)
    try:
        response = api.post(
            "/v1/batches",
            json={
                "prompts": [task],
                "n_samples": 1,
                "max_staleness": 0,
                "limits": {"max_turns": 3},
                "sampling": {"max_tokens": 16, "temperature": 1.0, "seed": 7},
            },
        )
        assert response.status_code == 202, response.text
        batch = response.json()
        assert served.proxy.held.wait(300), "the job's second model call never came"
        applied(update(api, "step-4", step_4))
    finally:
        served.proxy.release()
    done = wait_for(
        lambda: (b := api.get(f"/v1/batches/{batch['id']}").json())["status"] != "running" and b,
        timeout=300,
        what="the batch to end",
    )
    assert done["counts"]["stale"] == 1 and done["counts"]["used"] == 0, done
    [summary] = api.get("/v1/jobs", params={"group_id": f"b.{batch['id']}.0"}).json()["jobs"]
    record = wait_status(api, summary["id"])
    turns = [t for t in record["result"]["trajectory"]["turns"] if t["role"] == "assistant"]
    assert len(turns) >= 2, record
    assert turns[0]["policy_version"] == "step-2", turns[0]
    assert {s["version"] for s in turns[0]["weight_versions"]} == {"step-2"}, turns[0]
    assert {s["version"] for t in turns[1:] for s in t["weight_versions"]} == {"step-4"}, turns


def test_a_backend_that_fails_the_update_leaves_the_pool_and_the_rest_update(served) -> None:
    url = served.proxy.url  # the address the pool knows the real server by
    api = client_for(served.stack)
    double = BrokenWeightsBackend(SERVED_NAME).start()
    try:
        registered = api.post("/v1/backends", json={"url": double.url, "model": SERVED_NAME})
        assert registered.status_code == 201, registered.text
        seq_before = api.get(f"/v1/models/{SERVED_NAME}/weights").json()["seq"]
        response = update(api, "step-5", checkpoint(served.root, 5))
        assert response.status_code == 200, response.text
        result = response.json()
        by_url = {b["url"]: b for b in result["backends"]}
        assert by_url[url]["status"] == "updated" and not by_url[url]["removed_from_pool"]
        assert by_url[double.url]["status"] == "failed" and by_url[double.url]["removed_from_pool"]
        assert result["seq"] == seq_before + 1, result  # the next number: taken although one backend failed
        views = {b["url"]: b for b in api.get("/v1/backends").json()["backends"]}
        assert views[url]["healthy"] and not views[double.url]["healthy"]
        assert "step-5" in views[double.url]["unhealthy_reason"]
    finally:
        double.stop()
