"""A weight update through the service against a real vLLM server (its own: the update changes it).

One module-scoped server and stack (as `rollouts up --backend-url` runs them); the tests run in
order and each leaves the server on the version it applied. Checkpoints are the tiny model with
other seeds; the logprobs the server reports are compared with transformers' on the same tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from cli.stack import Stack
from cli.tiny_model import build_tiny_model, build_tokenizer
from shared.config import Settings
from tests.support.broken_weights_backend import BrokenWeightsBackend
from tests.support.vllm_server import SERVED_NAME, start_server
from tests.support.waiting import client_for, wait_for, wait_status

pytestmark = pytest.mark.vllm

ENV = {"ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds", "ROLLOUTS_MAINTENANCE_INTERVAL_S": "1",
       "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "1"}  # fmt: skip
# 300 tokens: several full KV blocks, so a second request with this prefix hits the prefix cache.
PROMPT = [(7 * i) % 200 + 40 for i in range(300)]


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Stack, Path]]:
    root = tmp_path_factory.mktemp("weights")
    server = start_server(tiny_model, root)
    stack = Stack(Settings(redis_url=None, state_dir=root / "state"), api_port=0, log_dir=root / "logs",
                  concurrency={"init": 1, "rollout": 2, "eval": 1}, backend_urls=[server.url], extra_env=ENV)
    try:
        stack.start()
        stack.wait_for_workers()
        yield server.url, stack, root
    finally:
        stack.stop(timeout=20)
        server.stop()


def checkpoint(root: Path, seed: int, intermediate: int | None = None) -> Path:
    """The tiny model with other weights (or, with `intermediate`, other shapes), saved as the trainer saves."""
    model = build_tiny_model(build_tokenizer(), seed, 4096)
    if intermediate is not None:
        config = copy.deepcopy(model.config)
        config.intermediate_size = intermediate
        model = type(model)(config)
    directory = root / f"ckpt-s{seed}-{intermediate}"
    model.save_pretrained(directory)
    return directory


def sample(url: str, seed: int) -> tuple[list[int], list[float]]:
    """Four tokens after PROMPT at temperature 1, with the logprob vLLM reports for each."""
    body = {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 1.0, "seed": seed,
            "logprobs": 0, "return_token_ids": True}  # fmt: skip
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def prefix_hits(url: str) -> float:
    """Prompt tokens vLLM found in its prefix cache so far (its own counter, GET /metrics)."""
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:prefix_cache_hits_total"))


def gap_to(directory: Path, tokens: list[int], logprobs: list[float]) -> float:
    """max |vLLM's logprob - transformers' logprob| of the sampled tokens, under the checkpoint in `directory`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1].log_softmax(-1)
    expected = logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    return float((expected - torch.tensor(logprobs)).abs().max())


def update(api: httpx.Client, version: str, path: Path | str, **extra: object) -> httpx.Response:
    return api.post(f"/v1/models/{SERVED_NAME}/weights", json={"version": version, "path": str(path), **extra},
                    timeout=300)  # fmt: skip


def test_an_update_serves_the_new_weights_from_a_reset_cache_under_the_new_version(served) -> None:
    url, stack, root = served
    api = client_for(stack)
    sample(url, seed=3)  # cache the prompt under the weights before the update
    response = update(api, "step-1", checkpoint(root, 1))
    assert response.status_code == 200, response.text
    result = response.json()
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
    job = {"task": {"kind": "agent-answer", "problem": "What is 2 + 2?", "answer": "4", "stop_on_no_tool_call": False},
           "limits": {"max_turns": 2}, "sampling": {"max_tokens": 24, "temperature": 1.0, "seed": 5}}  # fmt: skip
    [job_id] = api.post("/v1/jobs", json=[job]).json()["job_ids"]
    record = wait_status(api, job_id, timeout=300)
    assert record["status"] == "done", record.get("error")
    turns = [t for t in record["result"]["trajectory"]["turns"] if t["role"] == "assistant"]
    assert turns and all(t["policy_version"] == "step-1" for t in turns)
    assert all({s["version"] for s in t["weight_versions"]} == {"step-1"} for t in turns)


def test_bad_checkpoints_and_a_backwards_version_are_refused_and_serving_goes_on(served) -> None:
    url, stack, root = served
    api = client_for(stack)
    assert update(api, "step-2", checkpoint(root, 2)).json()["seq"] == 2
    refusals = [
        (update(api, "step-3", root / "missing"), "body.path"),
        (update(api, "step-3", checkpoint(root, 3, intermediate=256)), "body.path"),  # shapes do not fit
        (update(api, "step-1", checkpoint(root, 1)), "body.version"),  # step-2 came after it
    ]
    for response, field in refusals:
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["field"] == field, response.text
    assert "mlp" in refusals[1][0].json()["detail"]  # names a tensor whose shape differs
    assert api.get(f"/v1/models/{SERVED_NAME}/weights").json()["version"] == "step-2"
    [backend] = api.get("/v1/backends").json()["backends"]
    assert backend["healthy"], backend
    tokens, logprobs = sample(url, seed=6)
    assert gap_to(checkpoint(root, 2), tokens, logprobs) < 1e-3  # still step-2's weights, and serving
    assert update(api, "step-2", checkpoint(root, 2)).json()["seq"] == 2  # re-applying the current one: a retry


def test_a_trajectory_older_than_max_staleness_is_not_admitted(served) -> None:
    """A long job straddles an update: its first turn's version is one update behind at max_staleness 0."""
    url, stack, root = served
    api = client_for(stack)
    task = {"kind": "agent-answer", "problem": "Count to a thousand.", "answer": "x", "stop_on_no_tool_call": False}
    batch = api.post("/v1/batches", json={
        "prompts": [task], "n_samples": 1, "max_staleness": 0,
        "limits": {"max_turns": 6}, "sampling": {"max_tokens": 600, "temperature": 1.0, "seed": 7},
    }).json()  # fmt: skip
    wait_for(lambda: api.get("/v1/backends").json()["inflight"] >= 1, timeout=120, what="the job to generate")
    assert update(api, "step-4", checkpoint(root, 4)).json()["backends"][0]["status"] == "updated"
    done = wait_for(lambda: (b := api.get(f"/v1/batches/{batch['id']}").json())["status"] != "running" and b,
                    timeout=300, what="the batch to end")  # fmt: skip
    assert done["counts"]["stale"] == 1 and done["counts"]["used"] == 0, done
    [summary] = api.get("/v1/jobs", params={"group_id": f"b.{batch['id']}.0"}).json()["jobs"]
    turns = [t for t in wait_status(api, summary["id"])["result"]["trajectory"]["turns"] if t["role"] == "assistant"]
    assert turns[0]["policy_version"] == "step-2" and turns[-1]["weight_versions"][-1]["version"] == "step-4"


def test_a_backend_that_fails_the_update_leaves_the_pool_and_the_rest_update(served) -> None:
    url, stack, root = served
    api = client_for(stack)
    double = BrokenWeightsBackend(SERVED_NAME).start()
    try:
        assert api.post("/v1/backends", json={"url": double.url, "model": SERVED_NAME}).status_code == 201
        result = update(api, "step-5", checkpoint(root, 5)).json()
        by_url = {b["url"]: b for b in result["backends"]}
        assert by_url[url]["status"] == "updated" and not by_url[url]["removed_from_pool"]
        assert by_url[double.url]["status"] == "failed" and by_url[double.url]["removed_from_pool"]
        assert result["seq"] == 4  # step-1, step-2, step-4, step-5: the refused step-3 took no number
        views = {b["url"]: b for b in api.get("/v1/backends").json()["backends"]}
        assert views[url]["healthy"] and not views[double.url]["healthy"]
        assert "step-5" in views[double.url]["unhealthy_reason"]
    finally:
        double.stop()
