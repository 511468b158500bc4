"""CPU backends as real subprocesses on free ports, sharing one built tiny model per test session."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backend_procs import CpuBackendProcess, wait_healthy
from shared.embedded_redis import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cpu_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cpu-backend-state")


@pytest.fixture(scope="session")
def start_cpu_backends(cpu_state_dir: Path) -> Iterator[Callable[..., list[CpuBackendProcess]]]:
    """Start n backends at once (they load in parallel); every one is killed at session end."""
    started: list[CpuBackendProcess] = []

    def start(n: int = 1, *extra: str) -> list[CpuBackendProcess]:
        batch = []
        for _ in range(n):
            port = free_port()
            log_path = cpu_state_dir / f"backend-{port}.log"
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
            process = subprocess.Popen(
                [sys.executable, "-m", "cpu_backend", "--port", str(port), "--state-dir", str(cpu_state_dir),
                 "--max-model-len", "2048", *extra],
                cwd=REPO, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
            )
            batch.append(CpuBackendProcess(f"http://127.0.0.1:{port}", process, log_path))
        started.extend(batch)
        for backend in batch:
            wait_healthy(backend)
        return batch

    yield start
    for backend in started:
        backend.kill()


@pytest.fixture(scope="session")
def cpu_backend(start_cpu_backends: Callable[..., list[CpuBackendProcess]]) -> CpuBackendProcess:
    """One CPU backend shared by the read-only tests of the session."""
    return start_cpu_backends(1)[0]


@pytest.fixture(scope="session")
def tiny_model_dir(cpu_backend: CpuBackendProcess, cpu_state_dir: Path) -> Path:
    """The model the shared backend serves (built by it on first start)."""
    [model_dir] = [p for p in (cpu_state_dir / "models").iterdir() if not p.name.startswith(".")]
    return model_dir
