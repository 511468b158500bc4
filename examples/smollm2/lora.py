"""The trained policy as a LoRA adapter on SmolLM2, and how a new version of it reaches vLLM.

LoRA rather than full weights: SmolLM2 ties its embeddings, and vLLM's `reload_weights` does
not refresh a tied lm_head (docs/TRAINING.md); an adapter leaves the base weights, tied ones
included, untouched. It is also 1.8% of the parameters to train and 9.8 MB to push.

`push_adapter` is the one place that talks to the backends directly. The service will get
an admin endpoint for weight updates (a LoRA path included); at that point this function
becomes that one client call, and nothing else changes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx

from examples.train_grpo.service import backend_urls, checked
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
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=TARGET_MODULES,
                        task_type="CAUSAL_LM")
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
    """Every healthy backend serves `adapter_dir` as `name` from now on, its tokens labelled `version`.

    Per backend, as `load_weights` does for full checkpoints: pause (running requests finish), load
    the adapter in place (same name and LoRA id, new weights), drop the prefix cache (its blocks
    were computed with the old adapter under the same LoRA id), set the weight version, resume.
    The trainer stops at the first backend that fails.
    """
    urls = backend_urls(client)
    if not urls:
        raise RuntimeError("no healthy backend to load the adapter into")
    for url in urls:
        load_adapter(url, adapter_dir, version, name)
    return urls


def load_adapter(url: str, adapter_dir: Path, version: str, name: str) -> None:
    """One backend's part of `push_adapter`; a backend whose load failed stays paused (it raises)."""
    with httpx.Client(base_url=url, timeout=120) as backend:
        checked(backend.post("/pause", params={"mode": "wait"}))
        checked(backend.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(adapter_dir),
                                                        "load_inplace": True}))
        if checked(backend.post("/reset_prefix_cache")).json().get("success") is False:
            raise RuntimeError(f"{url} could not reset its prefix cache after loading {adapter_dir}")
        checked(backend.post("/update_weight_version", json={"new_version": version}))
        checked(backend.post("/resume"))
        served = checked(backend.get("/weight_info")).json()
    if served.get("weight_version") != version:
        raise RuntimeError(f"{url} reports weight version {served!r} after loading {version}")
