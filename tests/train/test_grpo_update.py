"""examples/smollm2's hand-written GRPO update (examples/train_grpo trains with TRL) on a tiny model: minibatches,
clipping, and the direction it moves."""

from __future__ import annotations

import torch

from examples.smollm2.grpo import clipped_loss, group_minibatches, grpo_update, token_logprobs
from examples.train_grpo.policy import build_policy, build_policy_tokenizer


def test_minibatches_hold_whole_groups_and_every_row_once() -> None:
    group_index = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    chunks = group_minibatches(group_index, 2)
    assert len(chunks) == 2
    assert sorted(torch.cat(chunks).tolist()) == list(range(12))
    for chunk in chunks:
        groups = set(group_index[chunk].tolist())
        assert all(int((group_index[chunk] == g).sum()) == 3 for g in groups)  # no group split


def test_more_minibatches_than_groups_gives_one_per_group() -> None:
    chunks = group_minibatches(torch.tensor([5, 5, 9, 9]), 8)
    assert sorted(len(c) for c in chunks) == [2, 2]


def test_the_clip_stops_the_gradient_past_the_trust_region() -> None:
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.0, 1.5, 0.5]])).requires_grad_()
    mask = torch.ones(1, 3)
    loss, outside, _ = clipped_loss(new, old, mask, torch.tensor([1.0]), clip_eps=0.2)
    loss.backward()
    assert outside.tolist() == [[0.0, 1.0, 1.0]]
    # A > 0: a ratio above 1 + eps gets no more push; one below 1 - eps still does (min picks the unclipped)
    assert new.grad[0, 0] < 0 and new.grad[0, 1] == 0 and new.grad[0, 2] < 0


def test_one_update_raises_the_rewarded_sample_and_lowers_the_other() -> None:
    torch.manual_seed(0)
    tokenizer = build_policy_tokenizer()
    model = build_policy(tokenizer, 0, hidden=32, layers=1)
    prompt = tokenizer.encode("2*3")
    good, bad = prompt + tokenizer.encode("6"), prompt + tokenizer.encode("5")
    input_ids = torch.tensor([good, bad])
    attention = torch.ones_like(input_ids)
    mask = torch.zeros_like(input_ids)
    mask[:, len(prompt) :] = 1
    with torch.no_grad():
        old = torch.zeros(input_ids.shape)
        old[:, 1:] = token_logprobs(model, input_ids, attention)
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": mask,
        "old_logprobs": old,
        "advantages": torch.tensor([1.0, -1.0]),
        "group_index": torch.tensor([0, 0]),
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    stats = grpo_update(model, optimizer, batch, minibatches=1)
    with torch.no_grad():
        new = token_logprobs(model, input_ids, attention)[:, len(prompt) - 1 :].sum(dim=1)
    before = old[:, len(prompt) :].sum(dim=1)
    assert new[0] > before[0] and new[1] < before[1]
    assert stats.logprob_gap < 1e-5  # the first minibatch is on-policy: the old logprobs are the model's
