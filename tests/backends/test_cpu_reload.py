"""POST /admin/load_weights: new weights and version swap in atomically, the prefix cache is cleared."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from cpu_backend.bootstrap import load, tiny_model_dir
from cpu_backend.engine import Engine
from cpu_backend.server import create_app

TOKEN = "reload-secret"
PROMPT = [257, 104, 105, 258, 10]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("reload"), seed=0, max_model_len=512)


@pytest.fixture(scope="module")
def other_dir(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same architecture with every weight changed, as a trainer's save_pretrained leaves it."""
    tokenizer, model = load(base_dir)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    target = tmp_path_factory.mktemp("policy-1")
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def client(base_dir: Path, admin_token: str | None = TOKEN) -> tuple[TestClient, Engine]:
    tokenizer, model = load(base_dir)
    engine = Engine(model, tokenizer, max_model_len=512, cache_entries=8)
    return TestClient(create_app(engine, "policy-0", base_dir, admin_token)), engine


def complete(http: TestClient) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 6, "seed": 3, "logprobs": 0, "ignore_eos": True, "return_token_ids": True}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def reload(http: TestClient, path: Path, version: str, token: str = TOKEN):
    return http.post("/admin/load_weights", json={"path": str(path), "version": version},
                     headers={"Authorization": f"Bearer {token}"})


def test_reload_swaps_weights_version_and_clears_the_prefix_cache(base_dir: Path, other_dir: Path) -> None:
    http, engine = client(base_dir)
    before = complete(http)
    assert before["model"] == "policy-0"
    assert len(engine.prefix_cache) > 0

    response = reload(http, other_dir, "policy-1")
    assert response.status_code == 200, response.text
    assert response.json() == {"version": "policy-1", "path": str(other_dir)}
    assert len(engine.prefix_cache) == 0, "KV entries of the old weights must not survive the swap"

    after = complete(http)
    assert after["model"] == "policy-1"
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert after["choices"][0]["logprobs"]["token_logprobs"] != before["choices"][0]["logprobs"]["token_logprobs"]
    assert http.get("/v1/models").json()["data"][0]["id"] == "policy-1"
    assert http.post("/v1/completions", json={"prompt": PROMPT, "model": "policy-0"}).status_code == 404

    # The logprobs are those of the new weights: an independent forward pass agrees.
    _, fresh = load(other_dir)
    tokens = PROMPT + after["choices"][0]["token_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(fresh(torch.tensor([tokens])).logits[0, :-1].float(), -1)
    expected = [float(logp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(after["choices"][0]["token_ids"])]
    assert after["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-4)


def test_reload_needs_the_admin_token(base_dir: Path, other_dir: Path) -> None:
    http, engine = client(base_dir)
    assert reload(http, other_dir, "policy-1", token="wrong").status_code == 401
    off, _ = client(base_dir, admin_token=None)
    assert reload(off, other_dir, "policy-1").status_code == 403
    assert engine.version == "policy-0"


def test_reload_refuses_what_it_cannot_serve(base_dir: Path, tmp_path: Path) -> None:
    http, engine = client(base_dir)
    assert reload(http, tmp_path, "policy-1").status_code == 400  # no config.json
    assert http.post("/admin/load_weights", json={"path": str(base_dir), "version": ""},
                     headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 400
    assert engine.version == "policy-0"
    assert complete(http)["model"] == "policy-0"
