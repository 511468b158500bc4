"""`rollouts register` against a real API and a real vLLM server: join, beat, leave on SIGTERM; refusals."""

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
from cli.embedded_redis import free_port
from cli.vllm_server import VLLMServer
from shared.config import Settings

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
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "ROLLOUTS_STATE_DIR": str(state_dir),
        "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "0.2",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def stop(process: subprocess.Popen[bytes]) -> str:
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    return output.decode(errors="replace")


def test_register_heartbeats_then_deregisters_on_sigterm(api_url: str, vllm_server: VLLMServer, tmp_path: Path) -> None:
    process = run_cli(
        [
            "register",
            "--backend-url",
            vllm_server.url,
            "--model",
            "tiny",
            "--api-url",
            api_url,
            "--capacity",
            "3",
            "--label",
            "site=test",
        ],
        tmp_path,
    )
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


def test_register_of_a_model_the_server_does_not_serve_exits_with_the_reason(
    api_url: str, vllm_server: VLLMServer, tmp_path: Path
) -> None:
    process = run_cli(
        ["register", "--backend-url", vllm_server.url, "--model", "gpt-5", "--api-url", api_url], tmp_path
    )
    output, _ = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "gpt-5" in output.decode() and "['tiny']" in output.decode()
    assert listed(api_url) == []
