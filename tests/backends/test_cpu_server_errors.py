"""The CPU backend's HTTP layer answers edge cases as vLLM does, with its ErrorResponse body."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from cpu_backend.server import create_app

ERROR_FIELDS = {"message", "type", "param", "code"}


class BrokenEngine:
    """Just enough of an Engine for the HTTP layer; generation always blows up."""

    version = ""
    max_model_len = 64
    running = waiting = 0

    def __init__(self) -> None:
        self.calls = 0
        self.tokenizer = SimpleNamespace(encode=lambda text: [ord(c) for c in text])

    def generate(self, prompt: list[int], params: object) -> object:
        self.calls += 1
        raise RuntimeError("CUDA-like engine failure")


@pytest.fixture()
def engine() -> BrokenEngine:
    return BrokenEngine()


@pytest.fixture()
def http(engine: BrokenEngine, tmp_path: Path) -> TestClient:
    with TestClient(create_app(engine, "tiny", tmp_path), raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("prompt", [[], [[]], ""])
def test_an_empty_prompt_is_a_400_error_response(http: TestClient, engine: BrokenEngine, prompt: object) -> None:
    response = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400
    error = response.json()["error"]
    assert ERROR_FIELDS <= set(error) and error["code"] == 400 and error["param"] == "prompt"
    assert engine.calls == 0


def test_an_engine_failure_is_a_json_500_error_response(http: TestClient) -> None:
    response = http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
    assert response.status_code == 500 and response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert ERROR_FIELDS <= set(error) and error["code"] == 500 and error["type"] == "InternalServerError"
    assert "CUDA-like engine failure" in error["message"]
