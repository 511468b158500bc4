"""The stack the trainer bridges are tested against, and the trainers' own virtualenv that runs their code.

The stack: embedded Redis, API, one worker per stage, the session's real vLLM server (the tiny
model) as its one backend, and the test kinds (`agent-answer`: finish-only, multi-turn with nudges).
The trainers (verl, SkyRL) live in a virtualenv of their own that `scripts/setup.sh test` builds
(~/.cache/rollouts/trainers): their torch and transformers pins are not the project's. A test runs
a driver script there, with the client from this checkout on PYTHONPATH, and checks what it wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.stack import Stack
from cli.vllm_server import VLLMServer
from shared.config import Settings
from tests.support.trainers_env import REPO, trainers_python

ENV = {"ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds"}


@dataclass
class Service:
    stack: Stack
    model_dir: Path

    @property
    def api_url(self) -> str:
        return self.stack.api_url


@pytest.fixture(scope="session")
def service(vllm_server: VLLMServer, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("trainers")
    stack = Stack(
        Settings(redis_url=None, state_dir=root / "state"),
        api_port=0,
        log_dir=root / "logs",
        concurrency={"init": 2, "rollout": 8, "eval": 2},
        backend_urls=[vllm_server.url],
        extra_env=ENV,
    )
    try:
        stack.start()
        stack.wait_for_workers()
        yield Service(stack, tiny_model)
    finally:
        stack.stop(timeout=20)


def run_driver(
    script: str, model_dir: Path, given: dict[str, Any], api_url: str, tmp_path: Path, python: Path | None = None
) -> dict[str, Any]:
    """Run tests/trainers/<script> in the trainers' virtualenv (or `python`'s) on `given` (written as JSON); the JSON
    it wrote."""
    n = len(list(tmp_path.iterdir()))
    given_path, out = tmp_path / f"{script}.{n}.in.json", tmp_path / f"{script}.{n}.out.json"
    given_path.write_text(json.dumps(given))
    environment = {**os.environ, "ROLLOUTS_API_URL": api_url, "PYTHONPATH": str(REPO / "client")}
    environment.pop("VIRTUAL_ENV", None)
    ran = subprocess.run(
        [
            str(python or trainers_python()),
            str(REPO / "tests" / "trainers" / script),
            str(model_dir),
            str(given_path),
            str(out),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        check=False,
    )
    if ran.returncode != 0 or not out.exists():
        sys.stderr.write(ran.stdout[-5000:] + ran.stderr[-10000:])
        raise AssertionError(f"{script} exited {ran.returncode}: {ran.stderr[-2000:]}")
    return json.loads(out.read_text())
