"""The backend tests run against real vLLM servers (tests/support/vllm_server.py): the session's one, or their own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cli.vllm_server import VLLMServer


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model: Path) -> Path:
    """The model the session's server serves."""
    return tiny_model


@pytest.fixture()
def start_backends(start_vllm_servers: Callable[[int], list[VLLMServer]]) -> Callable[[int], list[VLLMServer]]:
    return start_vllm_servers
