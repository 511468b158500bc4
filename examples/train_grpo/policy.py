"""The policy: the embedded default's byte-level ChatML tokenizer and a small Llama, built offline.

The chat template takes `tools` itself and lists only their names: the service then
does not prepend the tools' JSON schemas to the system message (it does that for
templates that ignore `tools`), which keeps prompts near 100 bytes instead of 1,000,
and a byte-level model on two CPU cores fast enough to train in minutes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from cli.tiny_model import CHATML_TEMPLATE, build_tokenizer

TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>tools\\n' }}"
    "{% for tool in tools %}{{ tool['function']['name'] + '\\n' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
) + CHATML_TEMPLATE
MAX_LEN = 512
HEAD_DIM = 32


def build_policy_tokenizer() -> Any:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TOOLS_TEMPLATE
    return tokenizer


def build_policy(tokenizer: Any, seed: int, hidden: int = 128, layers: int = 4) -> Any:
    """A fresh Llama: `layers` x `hidden`, heads of 32 (half as many KV heads), weights seeded.

    Heads of 32 because vLLM's CPU attention takes no smaller ones; untied embeddings because
    vLLM's in-place weight reload does not refresh a tied lm_head.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, hidden // HEAD_DIM)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_LEN,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def save_policy(model: Any, tokenizer: Any, target: Path) -> Path:
    """save_pretrained into a temp dir, then rename: a backend never loads a half-written checkpoint.

    A checkpoint of the same name from an earlier run into the same directory is replaced.
    """
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)  # left by a run that died mid-save
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
