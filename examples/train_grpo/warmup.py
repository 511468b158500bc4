"""Supervised warm-up on generated episodes, rendered exactly as the agent loop renders them.

A randomly initialised model never emits a valid tool call, so GRPO would see only zero
rewards. The warm-up first teaches the skill (python call, tool output, finish with the
product), then a habit of answering without the tool, so the policy starts with a
non-zero reward and a choice to learn: use the tool. The traces go through the same
ChatRenderer the rollout workers use (prompt, assistant turns ending in <|im_end|>,
observation deltas), so warm-up tokens and rollout tokens are the same sequences.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from examples.train_grpo.arith_kind import ArithKind, product, reference_turns, tool_call
from workers.rollout.chat_delta import ChatRenderer

TOOL_OUTPUT = "{}\n"  # what the python tool returns for print(x): the printed line


def guess_turn(task: dict[str, Any], rng: random.Random) -> str:
    """Answer without the tool: finish at once with a number of the product's width, right only by luck."""
    width = len(product(task))
    return tool_call("finish", {"answer": str(rng.randint(10 ** (width - 1), 10**width - 1))})


def render_episode(
    renderer: ChatRenderer, task: dict[str, Any], use_tool: bool = True, rng: random.Random | None = None
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one episode; the mask is 1 on assistant tokens.

    With the tool: the python call, its output, finish with the product (reward 1).
    Without (`rng` draws the guess): finish at once with a guess (reward ~0), the habit
    GRPO has to unlearn.
    """
    tokenizer = renderer.tokenizer
    eos, eos_text = tokenizer.eos_token_id, tokenizer.eos_token
    ids = list(renderer.prompt(renderer.prepare(ArithKind().messages(task))).token_ids)
    mask = [0] * len(ids)
    turns = reference_turns(task) if use_tool else (guess_turn(task, rng or random.Random()),)
    for i, content in enumerate(turns):
        generated = [*renderer.encode(content), eos]
        ids += generated
        mask += [1] * len(generated)
        if i == 0 and use_tool:
            observation = [{"role": "tool", "name": "python", "content": TOOL_OUTPUT.format(product(task))}]
            delta = renderer.observation(eos_text, observation).token_ids
            ids += delta
            mask += [0] * len(delta)
    return ids, mask


def renderer_for(tokenizer: Any) -> ChatRenderer:
    return ChatRenderer(tokenizer, ArithKind().tool_schemas())


def warm_up(
    model: Any,
    tokenizer: Any,
    tasks: Callable[[], dict[str, Any]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    target_nll: float,
    tool_share: float,
    habit_steps: int,
    habit_lr: float | None = None,
    lr_ramp_steps: int,
    rng: random.Random,
) -> list[float]:
    """Teach the skill, then the habit: SFT on tool episodes, then on a mix where most episodes guess.

    Phase 1 (at most `steps`, the rate ramped up linearly over the first `lr_ramp_steps`, a
    fixed number so that raising the cap changes nothing for a seed that ends sooner): every
    episode uses the tool, until the smoothed episode NLL (summed over its assistant tokens)
    drops below `target_nll`: the policy then copies the
    operands into the call and the product into finish. Phase 2 (`habit_steps` at
    `habit_lr`, same optimizer): only a `tool_share` of the episodes use the tool, the rest
    finish at once with a guess, so the policy reaches for the tool about that often: a
    reward near `tool_share`, and a choice for GRPO to learn. The habit also costs some of
    the skill, less at a lower rate (docs/TRAINING.md); a single mixed phase would learn the
    skill from a quarter of the episodes, about four times slower. Returns each step's mean
    NLL of the tool episodes.
    """
    renderer = renderer_for(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses: list[float] = []
    smoothed = float("inf")
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / max(1, lr_ramp_steps))
        losses.append(
            _sft_step(model, optimizer, renderer, [render_episode(renderer, tasks()) for _ in range(batch_size)])
        )
        smoothed = losses[-1] if step == 0 else 0.8 * smoothed + 0.2 * losses[-1]
        if smoothed < target_nll:
            break
    tools = max(1, round(tool_share * batch_size))
    for group in optimizer.param_groups:
        group["lr"] = lr if habit_lr is None else habit_lr
    for _ in range(habit_steps):
        episodes = [render_episode(renderer, tasks(), i < tools, rng) for i in range(batch_size)]
        losses.append(_sft_step(model, optimizer, renderer, episodes, scored=tools))
    model.eval()
    return losses


def _sft_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    renderer: ChatRenderer,
    episodes: list[tuple[list[int], list[int]]],
    scored: int | None = None,
) -> float:
    """One optimizer step of next-token loss on assistant tokens; returns the mean NLL of the first `scored` episodes."""
    pad = renderer.tokenizer.pad_token_id
    width = max(len(ids) for ids, _ in episodes)
    input_ids = torch.full((len(episodes), width), pad, dtype=torch.long)
    mask = torch.zeros((len(episodes), width))
    for row, (ids, m) in enumerate(episodes):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(m)] = torch.tensor(m, dtype=torch.float)
    attention = (torch.arange(width)[None, :] < torch.tensor([len(i) for i, _ in episodes])[:, None]).long()
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
    loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scored = len(episodes) if scored is None else scored
    return float((nll.detach() * mask[:, 1:])[:scored].sum()) / scored
