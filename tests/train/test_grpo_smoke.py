"""Smoke test of examples/train_grpo: two GRPO steps through a live stack, with weight reloads.

Tiny on purpose (one fixed one-digit problem, groups of 4, a short warm-up): it proves the
plumbing, not the learning (docs/TRAINING.md has the full run). Checks that the
update changed the weights, that the backend serves the new checkpoint under its new
version (vLLM's /weight_info), and that the next step's trajectories recorded that version in every turn.
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
    prompts_per_step=3,
    min_informative=1,
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
    batch_timeout_s=240,
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("grpo")
    tokenizer = build_policy_tokenizer()
    base = save_policy(build_policy(tokenizer, 0, CONFIG.hidden, CONFIG.layers), tokenizer, root / "base")
    stack = start_stack(root, base, rollout_slots=4)
    try:
        with RolloutClient(stack.api_url) as client:
            yield root, client
    finally:
        stack.stop()


def test_two_grpo_steps_update_reload_and_record_the_new_version(service) -> None:
    root, client = service
    rows = train_seed(client, seed=0, config=CONFIG, out=root / "run")

    assert [r.step for r in rows] == [0, 1, 2]
    for row in rows:
        assert row.failed_groups == 0
        assert row.samples > 0
        # every turn of every completed trajectory of the step came from the version loaded before it
        assert row.versions_seen == row.policy_version == f"s0-v{row.step}", row
    updated = [r for r in rows[:-1] if r.trained_samples > 0]
    assert updated, f"no informative group in two steps: rewards {[r.mean_reward for r in rows]}"
    assert all(r.logprob_gap < 1e-3 for r in updated), "backend logprobs must match the trainer's forward pass"

    first = updated[0]
    before = load_file(root / "run" / "seed0" / first.policy_version / "model.safetensors")
    after = load_file(root / "run" / "seed0" / f"s0-v{first.step + 1}" / "model.safetensors")
    assert any(not before[name].equal(after[name]) for name in before), "the update did not change the weights"

    [url] = backend_urls(client)
    assert httpx.get(f"{url}/weight_info").json()["weight_version"] == "s0-v2"
    current = client.current_weights("policy")  # the service's own record of the update order
    assert (current["version"], current["seq"]) == ("s0-v2", 3)
