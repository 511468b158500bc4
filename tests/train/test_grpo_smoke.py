"""Smoke test of examples/train_grpo: TRL's GRPOTrainer for two generations through a live stack, with weight reloads.

Tiny on purpose (one fixed one-digit problem, groups of 4, a short warm-up): it proves the
plumbing, not the learning (docs/TRAINING.md has the full run). Checks that TRL's updates changed
the weights, that the bridge's callback loaded every optimizer step into the backend under its
version (vLLM's /weight_info, the service's order), and that each generation's trajectories
recorded the version pushed before it in every turn, with the backend's logprobs equal to the
trainer's forward pass.
"""

from __future__ import annotations

import httpx
import pytest
from safetensors.torch import load_file

from examples.train_grpo.policy import build_policy, build_policy_tokenizer, save_policy
from examples.train_grpo.run import Config, train_seed
from examples.train_grpo.service import backend_urls, start_stack
from rollouts_client import RolloutClient

pytestmark = pytest.mark.vllm

# One fixed problem and no habit phase: the warm-up only has to memorise one episode and stops
# while the sampled episode is still often wrong (NLL 1.0), so groups are informative.
CONFIG = Config(
    steps=2,
    prompts_per_step=2,
    group_size=4,
    max_digits=1,
    problem_pool=1,
    warmup_steps=200,
    warmup_ramp_steps=20,
    warmup_nll=1.0,
    tool_share=1.0,
    habit_steps=0,
    warmup_batch=16,
    warmup_lr=5e-3,
    lr=1e-3,
    hidden=64,
    layers=2,
    max_tokens=96,
    job_timeout_s=240,
    keep_checkpoints=5,
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("grpo")
    tokenizer = build_policy_tokenizer()
    base = save_policy(build_policy(tokenizer, 0, CONFIG.hidden, CONFIG.layers), tokenizer, root / "base")
    stack = start_stack(root, base, rollout_slots=4)
    try:
        with RolloutClient(stack.api_url) as client:
            yield root, client, stack.api_url
    finally:
        stack.stop()


def test_two_grpo_generations_update_reload_and_record_the_new_version(service) -> None:
    root, client, api_url = service
    rows = train_seed(api_url, None, seed=0, config=CONFIG, out=root / "run")

    # one row per generation, at optimizer steps 0 and 2 (num_iterations=2: two updates per generation)
    assert [(r.step, r.policy_version) for r in rows] == [(0, "s0-step-0"), (1, "s0-step-2")]
    for row in rows:
        assert row.samples == CONFIG.prompts_per_step * CONFIG.group_size
        assert row.versions_seen == row.policy_version, row  # every turn: the version pushed before it
        assert row.logprob_gap < 1e-3, "backend logprobs must match the trainer's forward pass"

    before = load_file(root / "run" / "seed0" / "s0-step-0" / "model.safetensors")
    after = load_file(root / "run" / "seed0" / "s0-step-4" / "model.safetensors")
    assert any(not before[name].equal(after[name]) for name in before), "TRL's update did not change the weights"

    [url] = backend_urls(client)
    assert httpx.get(f"{url}/weight_info").json()["weight_version"] == "s0-step-4"
    current = client.current_weights("policy")  # the service's own record of the update order
    assert (current["version"], current["seq"]) == ("s0-step-4", 5)
