"""Supervised warm-up on generated correct episodes, rendered exactly as the agent loop renders them.

A randomly initialised model never emits a valid tool call, so GRPO would see only
zero rewards. A short SFT on correct traces (python call, tool output, finish call)
gives a policy with a non-zero but imperfect reward. The traces go through the same
ChatRenderer the rollout workers use (prompt, assistant turns ending in <|im_end|>,
observation deltas), so warm-up tokens and rollout tokens are the same sequences.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from examples.train_grpo.arith_kind import ArithKind, product, reference_turns
from workers.rollout.chat_delta import ChatRenderer

TOOL_OUTPUT = "{}\n"  # what the python tool returns for print(x): the printed line


def render_episode(renderer: ChatRenderer, task: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one correct two-turn episode; the mask is 1 on assistant tokens."""
    tokenizer = renderer.tokenizer
    eos, eos_text = tokenizer.eos_token_id, tokenizer.eos_token
    history = renderer.prepare(ArithKind().messages(task))
    ids = list(renderer.prompt(history).token_ids)
    mask = [0] * len(ids)
    call, finish = reference_turns(task)
    for i, content in enumerate((call, finish)):
        generated = renderer.encode(content) + [eos]
        ids += generated
        mask += [1] * len(generated)
        if i == 0:
            observation = [{"role": "tool", "name": "python", "content": TOOL_OUTPUT.format(product(task))}]
            delta = renderer.observation(history, content, eos_text, observation).token_ids
            ids += delta
            mask += [0] * len(delta)
            history = [*history, {"role": "assistant", "content": content}, *observation]
    return ids, mask


def renderer_for(tokenizer: Any) -> ChatRenderer:
    return ChatRenderer(tokenizer, ArithKind().tool_schemas())


def warm_up(model: Any, tokenizer: Any, tasks: Callable[[], dict[str, Any]], *, steps: int, batch_size: int,
            lr: float, target_nll: float) -> list[float]:
    """Next-token SFT on assistant tokens only, until the mean episode NLL drops below `target_nll`.

    The episode NLL (summed over its assistant tokens) bounds the chance of sampling the
    whole correct episode at temperature 1: exp(-NLL) <= E[p(correct)] (Jensen). Stopping
    at NLL ~1 leaves a policy that is right a fair share of the time but not always: room
    for GRPO. Returns the episode NLL of each step (an exponential moving average decides).
    """
    renderer = renderer_for(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses: list[float] = []
    smoothed = float("inf")
    for step in range(steps):
        episodes = [render_episode(renderer, tasks()) for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in episodes)
        input_ids = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch_size, width))
        for row, (ids, m) in enumerate(episodes):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(m)] = torch.tensor(m, dtype=torch.float)
        attention = (torch.arange(width)[None, :] < torch.tensor([len(i) for i, _ in episodes])[:, None]).long()
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        episode_nll = float((nll.detach() * mask[:, 1:]).sum()) / batch_size
        for group in optimizer.param_groups:  # linear warm-up over the first 10% of steps
            group["lr"] = lr * min(1.0, (step + 1) / max(1, steps // 10))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(episode_nll)
        smoothed = episode_nll if step == 0 else 0.8 * smoothed + 0.2 * episode_nll
        if smoothed < target_nll:
            break
    model.eval()
    return losses
