"""Build (once) the embedded default's model: a tiny Llama that vLLM serves, with no network access.

No model can be downloaded where this runs, so the default is a tiny Llama-architecture
causal LM built from a config with seeded random weights, and a byte-level tokenizer
(every byte is a token, so any text round-trips) with ChatML special tokens and chat
template. It is saved as an ordinary Hugging Face model directory, so vLLM serves it and
everything downstream (the agent loop's chat-template deltas included) treats it like a
real model. `rollouts up --model DIR` serves any local HF causal-LM directory instead.

Shape constraints come from vLLM's CPU build: its attention kernels take head sizes of 32
and up (`CPUAttentionBackend.get_supported_head_sizes`), so the model has 2 heads of 32.
The embeddings are untied: vLLM's in-place weight reload does not refresh a tied lm_head,
and a trainer must be able to push new weights into the running server.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

TINY_MODEL_VERSION = 2
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _byte_symbols() -> list[str]:
    """The printable stand-in character of each byte 0..255, as byte-level BPE spells bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    symbols: dict[int, int] = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = 256 + extra
            extra += 1
    return [chr(symbols[b]) for b in range(256)]


def build_tokenizer(
    special_tokens: list[str] = SPECIAL_TOKENS,
    chat_template: str = CHATML_TEMPLATE,
    eos_token: str = "<|im_end|>",
    bos_token: str | None = None,
    pad_token: str = "<|endoftext|>",
):  # -> transformers.PreTrainedTokenizerFast
    """Byte-level tokenizer: ids 0..255 are bytes, then the special tokens (ChatML's by default).

    Any text round-trips, so the same tokenizer can carry another model family's control tokens
    and chat template (the tests of real templates do that).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(_byte_symbols())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(special_tokens)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=eos_token,
        pad_token=pad_token,
        unk_token=None,
        bos_token=bos_token,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def build_tiny_model(tokenizer, seed: int, max_model_len: int):  # -> transformers.PreTrainedModel
    """A 2-layer, 64-wide Llama (2 heads of 32) with seeded weights: real attention, a fraction of a ms a token."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=max_model_len,
        tie_word_embeddings=False,
        # Wider than the usual 0.02 so the next-token distribution is not flat: sampling and
        # logprobs then differ visibly between tokens.
        initializer_range=0.5,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def tiny_model_dir(state_dir: Path, seed: int, max_model_len: int) -> Path:
    """Build the tiny model under <state_dir>/models on first use; later calls just return it.

    Built in a temporary directory and renamed into place, so concurrent first starts
    (several backends, several tests) never see a half-written model.
    """
    target = Path(state_dir) / "models" / f"tiny-chatml-v{TINY_MODEL_VERSION}-s{seed}-ctx{max_model_len}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        tokenizer = build_tokenizer()
        model = build_tiny_model(tokenizer, seed, max_model_len)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").exists():  # lost the race to a half-built dir: impossible
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load(model_dir: Path, threads: int = 1):
    """Load tokenizer and model from a local HF directory, offline, in float32 on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    return tokenizer, model.eval()
