"""What the weight-update tests and benches check a served model with: a checkpoint of other weights, a sample
from vLLM with its logprobs, and how far those logprobs are from transformers' under a checkpoint."""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import torch

from cli.tiny_model import build_tiny_model, build_tokenizer
from tests.support.vllm_server import SERVED_NAME

# 300 tokens: several full KV blocks, so a second request with this prefix hits the prefix cache.
PROMPT = [(7 * i) % 200 + 40 for i in range(300)]


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


def sample(url: str, seed: int, token: str | None = None) -> tuple[list[int], list[float]]:
    """Four tokens after PROMPT at temperature 1, with the logprob vLLM reports for each (through a node
    gateway: with its `token`)."""
    body = {
        "model": SERVED_NAME,
        "prompt": PROMPT,
        "max_tokens": 4,
        "temperature": 1.0,
        "seed": seed,
        "logprobs": 0,
        "return_token_ids": True,
    }
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def gap_to(directory: Path, tokens: list[int], logprobs: list[float]) -> float:
    """max |vLLM's logprob - transformers' logprob| of the sampled tokens, under the checkpoint in `directory`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1].log_softmax(-1)
    expected = logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    return float((expected - torch.tensor(logprobs)).abs().max())
