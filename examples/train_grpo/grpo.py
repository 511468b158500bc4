"""The GRPO update: token-level clipped policy gradient against the rollout's own logprobs.

    ratio_t = exp(log pi_theta(y_t | y_<t) - old_logprob_t)     old_logprob_t: the backend's, from the trajectory
    loss    = - sum_t mask_t * min(ratio_t * A, clip(ratio_t, 1-eps, 1+eps) * A) / sum_t mask_t

A is the sample's group-normalised reward (r - mean) / (std + 1e-6), computed by the
service (`advantages: grpo`); mask is the trajectory's loss_mask (model-generated
tokens only: tool output and template tokens never get gradient). Tokens are averaged
over the whole batch, not per sequence (DAPO's token-level loss), and there is no KL
term: the clip and the short run keep the policy near the warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class UpdateStats:
    loss: float
    clip_fraction: float  # share of masked tokens whose ratio left [1-eps, 1+eps]
    approx_kl: float  # mean of (ratio - 1) - log ratio (k3): drift from the rollout policy
    logprob_gap: float  # mean |new - old| logprob before the first update: backend/trainer agreement


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log pi(input_ids[:, t] | input_ids[:, :t]) for t >= 1, shape (B, T-1)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def clipped_loss(
    new_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, clipped-token indicator, ratio), all over the (B, T-1) shifted positions."""
    ratio = torch.exp(new_logp - old_logp)
    adv = advantages[:, None]
    unclipped, clipped = ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    outside = ((ratio < 1 - clip_eps) | (ratio > 1 + clip_eps)).float()
    return loss, outside, ratio


def group_minibatches(group_index: torch.Tensor, minibatches: int) -> list[torch.Tensor]:
    """Row indices of each minibatch, whole groups only, in a random order.

    A group's advantages sum to zero, so the gradient on tokens every sample shares (the
    template, the common prefix) cancels within a minibatch made of whole groups. Rows
    split at random do not cancel: each minibatch then pushes the shared tokens up or
    down by its leftover advantage, noise that Adam turns into full-size steps.
    """
    groups = group_index.unique()
    chunks = groups[torch.randperm(len(groups))].chunk(min(minibatches, len(groups)))
    return [torch.nonzero(torch.isin(group_index, chunk)).squeeze(1) for chunk in chunks]


def grpo_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    *,
    clip_eps: float = 0.2,
    minibatches: int = 2,
    max_grad_norm: float = 1.0,
) -> UpdateStats:
    """One pass over the batch in `minibatches` optimizer steps (later ones are slightly off-policy: the clip acts)."""
    input_ids, attention = batch["input_ids"], batch["attention_mask"]
    mask = batch["loss_mask"][:, 1:].float()
    old = batch["old_logprobs"][:, 1:].float()
    advantages = batch["advantages"].float()
    losses, clipped, kls, gaps = [], [], [], []
    model.train()
    for i, chunk in enumerate(group_minibatches(batch["group_index"], minibatches)):
        new = token_logprobs(model, input_ids[chunk], attention[chunk])
        m = mask[chunk]
        loss, outside, ratio = clipped_loss(new, old[chunk], m, advantages[chunk], clip_eps)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        with torch.no_grad():
            log_ratio = new - old[chunk]
            tokens = m.sum().clamp(min=1)
            losses.append(float(loss.detach()))
            clipped.append(float((outside * m).sum() / tokens))
            kls.append(float((((ratio - 1) - log_ratio) * m).sum() / tokens))
            if i == 0:
                gaps.append(float((log_ratio.abs() * m).sum() / tokens))
    model.eval()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return UpdateStats(mean(losses), mean(clipped), mean(kls), mean(gaps))
