"""Fixtures of the agent-loop tests: the tiny model's tokenizer, the scripted LLM test double, sandboxes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.sandboxes import running_sandbox
from tests.support.scripted_llm import ScriptedLLM
from workers.sandbox import Sandbox


class Unlimited:
    """A stage budget that never runs out (the loop's Budget protocol) for loop-level tests."""

    remaining = 1e9

    def check(self) -> None:
        pass


@pytest.fixture(scope="session")
def model_dir(tiny_model: Path) -> Path:
    """The tiny model (and its tokenizer) the session's vLLM server serves."""
    return tiny_model


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.fixture()
def scripted_llm(tokenizer: Any) -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM(tokenizer).start()
    yield llm
    llm.stop()


@pytest.fixture()
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    """A real sandbox (bubblewrap when it can run here, else the plain-process fallback)."""
    with running_sandbox(tmp_path, prefix="agt-") as box:
        yield box
