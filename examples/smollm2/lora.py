"""The trained policy as a LoRA adapter on SmolLM2, and how a new version of it reaches vLLM.

LoRA rather than full weights: SmolLM2 ties its embeddings, and vLLM's `reload_weights` does
not refresh a tied lm_head (docs/TRAINING.md); an adapter leaves the base weights, tied ones
included, untouched. It is also 1.8% of the parameters to train and 9.8 MB to push.

`push_adapter` hands a new version to the service's weight-update call (its LoRA path), which
applies it to every backend of the policy.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rollouts_client import RolloutClient

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_policy(base_dir: Path, rank: int, alpha: int) -> Any:
    """SmolLM2 in float32 with a fresh adapter on every projection; the adapter starts as the identity (B = 0).

    Dropout 0: the trainer's forward pass must give the logprobs vLLM sampled with.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=TARGET_MODULES, task_type="CAUSAL_LM"
    )
    return get_peft_model(base, config)


def save_adapter(model: Any, target: Path) -> Path:
    """The adapter alone (adapter_config.json, adapter_model.safetensors), written to a temp dir and renamed.

    Every version gets a directory of its own: vLLM warns that an in-place load from the same
    path reuses prefix-cache blocks of the old weights, and a backend must never read a half-written file.
    """
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def push_adapter(client: RolloutClient, adapter_dir: Path, version: str, name: str) -> list[str]:
    """Every backend serving `name` loads `adapter_dir` in place and labels its tokens `version`; returns their URLs.

    One service call (POST /v1/models/{name}/weights with `lora`): the service pauses each
    backend, loads the adapter in place (same name and LoRA id, new weights), drops the prefix
    cache (its blocks were computed with the old adapter under the same LoRA id), sets the
    weight version and resumes. A backend that fails leaves the pool and the trainer stops.
    """
    result = client.update_weights(name, version, path=str(adapter_dir.absolute()), lora=name)
    failed = [f"{b['url']}: {b['error']}" for b in result["backends"] if b["status"] != "updated"]
    if failed:
        raise RuntimeError(f"loading adapter {version} as {name!r} failed on {'; '.join(failed)}")
    return [b["url"] for b in result["backends"]]
