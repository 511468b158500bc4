"""The LoRA path of the weights route against a real vLLM server started with LoRA enabled
(its own, launched in the background a few modules ahead, stopped as the module ends).

The server serves adapter 0 under the name `policy-lora` from the start (`--lora-modules`), and
the pool knows the backend under that name; the update loads adapter 1 in place under the same
name. The adapter is written by hand in PEFT's format (q_proj and v_proj, rank 8), and the
reference logprobs come from transformers on the base model with the adapter merged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file

from cli.vllm_server import VLLMServer
from tests.support.vllm_server import launch_server, register_launch, session_server, tiny_model_path
from tests.support.weight_checks import PROMPT

pytestmark = pytest.mark.vllm

NAME, RANK, ALPHA = "policy-lora", 8, 16
TARGETS = {"q_proj": (64, 64), "v_proj": (32, 64)}  # (out, in) of the tiny model's projections


def write_adapter(directory: Path, seed: int, layers: int = 2) -> dict[str, torch.Tensor]:
    """A PEFT-format LoRA adapter with random A and B (PEFT starts B at 0: no visible effect)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for module, (out, inp) in TARGETS.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, inp, generator=generator) * 0.3
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, RANK, generator=generator) * 0.3
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": RANK,
                "lora_alpha": ALPHA,
                "lora_dropout": 0.0,
                "target_modules": sorted(TARGETS),
                "bias": "none",
                "base_model_name_or_path": None,
            }
        )
    )
    return tensors


def launch_lora_server(directory: Path) -> VLLMServer:
    """vLLM on the tiny model with LoRA enabled, serving adapter 0 as NAME, without waiting for it."""
    write_adapter(directory / "adapter-0", seed=0)
    return launch_server(
        tiny_model_path(),
        directory,
        args=["--enable-lora", "--max-lora-rank", str(RANK), "--lora-modules", f"{NAME}={directory / 'adapter-0'}"],
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
    )


register_launch("lora_server", launch_lora_server)


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VLLMServer, Path]]:
    root = tmp_path_factory.mktemp("lora")
    servers = session_server("lora_server", tmp_path_factory.mktemp("vllm-logs"))
    server = next(servers)
    try:
        yield server, root
    finally:
        servers.close()  # stops it


def merged_logprobs(base: Path, adapter: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """transformers' logprob of each sampled token with the adapter merged: W + alpha/r * B A."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            prefix = "base_model.model." + name.removesuffix(".weight")
            if f"{prefix}.lora_A.weight" in adapter:
                param += ALPHA / RANK * adapter[f"{prefix}.lora_B.weight"] @ adapter[f"{prefix}.lora_A.weight"]
        logits = model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1 : -1].log_softmax(-1)
    return logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]


def test_a_lora_adapter_is_replaced_in_place_through_the_weights_route(lora_server, make_client, tiny_model) -> None:
    server, root = lora_server
    api = make_client()
    assert api.post("/v1/backends", json={"url": server.url, "model": NAME}).status_code == 201
    adapter = write_adapter(root / "adapter-1", seed=1)
    response = api.post(
        f"/v1/models/{NAME}/weights", json={"version": "lora-1", "path": str(root / "adapter-1"), "lora": NAME}
    )
    assert response.status_code == 200, response.text
    [backend] = response.json()["backends"]
    assert backend["status"] == "updated", backend
    assert httpx.get(f"{server.url}/weight_info").json()["weight_version"] == "lora-1"
    body = {
        "model": NAME,
        "prompt": PROMPT,
        "max_tokens": 4,
        "temperature": 1.0,
        "seed": 3,
        "logprobs": 0,
        "return_token_ids": True,
    }
    choice = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()["choices"][0]
    served = torch.tensor(choice["logprobs"]["token_logprobs"])
    tokens = choice["token_ids"]
    assert float((merged_logprobs(tiny_model, adapter, tokens) - served).abs().max()) < 1e-3
    old = write_adapter(root / "adapter-0-again", seed=0)
    assert float((merged_logprobs(tiny_model, old, tokens) - served).abs().max()) > 1e-2, "still adapter 0"
    # a directory that is not an adapter is refused before vLLM sees it
    refused = api.post(f"/v1/models/{NAME}/weights", json={"version": "lora-2", "path": str(tiny_model), "lora": NAME})
    assert refused.status_code == 422 and "adapter_config.json" in refused.json()["detail"]
