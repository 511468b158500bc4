"""The worker extension on a model with tied embeddings (its own vLLM server: the tiny model, tied,
launched in the background a few modules ahead, stopped as the module ends).

A tied checkpoint has no lm_head.weight. The extension loads the payload with vLLM's in-place
reload, then copies the new embeddings into lm_head when vLLM holds it as its own tensor; the
logprobs vLLM reports afterwards must match transformers on the new tied checkpoint.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from cli.tiny_model import build_tiny_model, build_tokenizer
from cli.vllm_server import VLLMServer
from tests.support.vllm_server import launch_server, register_launch, session_server
from tests.support.weight_checks import gap_to, sample

pytestmark = pytest.mark.vllm


def tied_checkpoint(directory: Path, seed: int) -> Path:
    """The tiny model with tied embeddings, saved as the trainer saves (no lm_head.weight in the file)."""
    tokenizer = build_tokenizer()
    config = copy.deepcopy(build_tiny_model(tokenizer, seed, 4096).config)
    config.tie_word_embeddings = True
    torch.manual_seed(seed)
    model = type(build_tiny_model(tokenizer, seed, 4096))(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def launch_tied_server(directory: Path) -> VLLMServer:
    """vLLM serving the tiny model tied (seed 0) as its base, without waiting for it."""
    return launch_server(tied_checkpoint(directory / "base", 0), directory)


register_launch("tied_server", launch_tied_server)


@pytest.fixture(scope="module")
def tied_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("tied")
    servers = session_server("tied_server", tmp_path_factory.mktemp("vllm-logs"))
    server = next(servers)
    try:
        yield server.url, root
    finally:
        servers.close()  # stops it


def test_an_upload_into_a_tied_model_refreshes_its_lm_head(tied_server) -> None:
    url, root = tied_server
    new = tied_checkpoint(root / "new", 21)
    [file] = new.glob("*.safetensors")
    data = file.read_bytes()
    assert b"lm_head" not in data[:4096]  # the tie is the checkpoint's: the head comes from the embeddings
    response = httpx.post(
        f"{url}/collective_rpc",
        timeout=300,
        json={"method": "load_weights_from_bytes", "kwargs": {"data": base64.b64encode(data).decode()}},
    )
    assert response.status_code == 200, response.text
    [result] = response.json()["results"]
    assert result["tensors"] > 0 and result["tied_lm_head_refreshed"], result
    tokens, logprobs = sample(url, seed=3)
    assert gap_to(new, tokens, logprobs) < 1e-3, result
