"""A CPU backend subprocess handle for the tests (imported by conftest and tests alike)."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class CpuBackendProcess:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def wait_healthy(backend: CpuBackendProcess, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if backend.process.poll() is not None:
            raise RuntimeError(f"cpu backend exited: {backend.log_path.read_text()[-3000:]}")
        try:
            if httpx.get(backend.url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"cpu backend did not become healthy: {backend.log_path.read_text()[-3000:]}")
