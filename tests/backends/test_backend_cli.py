"""`rollouts register` and `rollouts cpu-backend --register` against a real API: join, beat, leave on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from api.app import create_app
from backend_procs import CpuBackendProcess
from shared.config import Settings
from shared.embedded_redis import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def api_url(settings: Settings) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def listed(api_url: str) -> list[dict]:
    return httpx.get(f"{api_url}/v1/backends").json()["backends"]


def run_cli(args: list[str], state_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROLLOUTS_STATE_DIR": str(state_dir),
           "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "0.2",
           "ROLLOUTS_CPU_BACKEND_MAX_MODEL_LEN": "2048"}  # the model the session's backends built
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> str:
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    return output.decode(errors="replace")


def test_register_heartbeats_then_deregisters_on_sigterm(
    api_url: str, cpu_backend: CpuBackendProcess, cpu_state_dir: Path
) -> None:
    process = run_cli(["register", "--backend-url", cpu_backend.url, "--model", "tiny", "--api-url", api_url,
                       "--capacity", "3", "--label", "site=test"], cpu_state_dir)
    try:
        wait_for(lambda: len(listed(api_url)) == 1, "registration")
        [backend] = listed(api_url)
        assert backend["capacity"] == 3 and backend["labels"] == {"site": "test"}
        first_beat = backend["last_heartbeat"]
        wait_for(lambda: listed(api_url)[0]["last_heartbeat"] > first_beat, "a heartbeat")
    finally:
        output = stop(process)
    assert process.returncode == 0, output
    assert listed(api_url) == [], "SIGTERM deregisters"


def test_cpu_backend_command_serves_and_registers_itself(api_url: str, cpu_state_dir: Path) -> None:
    port = free_port()
    process = run_cli(["cpu-backend", "--port", str(port), "--register", "--api-url", api_url], cpu_state_dir)
    try:
        wait_for(lambda: len(listed(api_url)) == 1, "self-registration")
        [backend] = listed(api_url)
        assert backend["url"] == f"http://127.0.0.1:{port}" and backend["healthy"]
        models = httpx.get(f"{backend['url']}/v1/models").json()
        assert models["data"][0]["id"] == backend["model"]
    finally:
        output = stop(process)
    assert process.returncode == 0, output
    assert listed(api_url) == []
