"""Fixtures of the agent-loop tests: the tiny model's tokenizer, the scripted LLM test double, sandboxes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.config import Settings
from tests.support.scripted_llm import ScriptedLLM
from workers.sandbox import Sandbox, SandboxSpec, create_sandbox
from workers.sandbox.local import bwrap_usable


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
    short = Path(tempfile.mkdtemp(prefix="agt-"))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings(state_dir=tmp_path / "state", sandbox_require_isolation=bwrap_usable()[0])
    box = create_sandbox(SandboxSpec(), workspace, short / "rt", settings)
    box.start()
    yield box
    box.stop()
    shutil.rmtree(short, ignore_errors=True)
