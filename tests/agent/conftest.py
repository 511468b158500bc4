"""Fixtures of the agent-loop tests: the tiny model's tokenizer, real CPU backends, the scripted LLM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cpu_backend.bootstrap import tiny_model_dir
from shared.config import Settings
from shared.embedded_redis import free_port
from shared.sandbox import Sandbox, SandboxSpec, create_sandbox
from shared.sandbox.local import bwrap_usable
from tests.backends.backend_procs import CpuBackendProcess, wait_healthy
from tests.support.scripted_llm import ScriptedLLM

REPO = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 2048


class Unlimited:
    """A stage budget that never runs out (the loop's Budget protocol) for loop-level tests."""

    remaining = 1e9

    def check(self) -> None:
        pass


@pytest.fixture(scope="session")
def model_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("agent-cpu-backend")


@pytest.fixture(scope="session")
def model_dir(model_state_dir: Path) -> Path:
    """The tiny model (and its tokenizer) the CPU backends of this session serve, built once."""
    return tiny_model_dir(model_state_dir, seed=0, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.fixture(scope="session")
def start_cpu_backends(model_state_dir: Path, model_dir: Path) -> Iterator[Callable[[int], list[CpuBackendProcess]]]:
    started: list[CpuBackendProcess] = []

    def start(n: int = 1) -> list[CpuBackendProcess]:
        batch = []
        for _ in range(n):
            port = free_port()
            log_path = model_state_dir / f"backend-{port}.log"
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
            process = subprocess.Popen(
                [sys.executable, "-m", "cpu_backend", "--port", str(port), "--model", str(model_dir),
                 "--max-model-len", str(MAX_MODEL_LEN)],
                cwd=REPO, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            batch.append(CpuBackendProcess(f"http://127.0.0.1:{port}", process, log_path))
        started.extend(batch)
        for backend in batch:
            wait_healthy(backend)
        return batch

    yield start
    for backend in started:
        backend.kill()


@pytest.fixture(scope="session")
def cpu_backend(start_cpu_backends: Callable[[int], list[CpuBackendProcess]]) -> CpuBackendProcess:
    return start_cpu_backends(1)[0]


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
