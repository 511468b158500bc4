"""`rollouts dashboard` serves rq-dashboard over the service's Redis: the queues it shows are ours."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from api.app import create_app
from cli.embedded_redis import EmbeddedRedis, free_port
from shared.config import Settings
from tests.support.waiting import wait_for


def test_the_dashboard_shows_the_services_queue_depths_and_keeps_the_password_out_of_argv(tmp_path: Path):
    password = "dash-pw-not-in-argv"
    with EmbeddedRedis(data_dir=tmp_path / "redis", password=password) as redis:
        settings = Settings(redis_url=redis.url, state_dir=tmp_path / "state")
        with TestClient(create_app(settings)) as api:
            assert api.post("/v1/jobs", json=[{"task": {"kind": "demo", "text": "x"}}] * 3).status_code == 202
        port = free_port()
        env = {**os.environ, "ROLLOUTS_REDIS_URL": redis.url}
        with open(tmp_path / "dashboard.log", "wb") as log:
            dashboard = subprocess.Popen(
                [sys.executable, "-m", "cli", "dashboard", "--port", str(port)], env=env, stdout=log, stderr=log
            )
        try:

            def queues() -> dict[str, int] | None:
                try:
                    response = httpx.get(f"http://127.0.0.1:{port}/0/data/queues.json", timeout=2.0)
                except httpx.HTTPError:
                    return None
                if response.status_code != 200:
                    return None
                return {q["name"]: q["count"] for q in response.json()["queues"]}

            depths = wait_for(queues, timeout=30, what="rq-dashboard to answer")
            argv = Path(f"/proc/{dashboard.pid}/cmdline").read_bytes().decode()
            page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5.0)
        finally:
            dashboard.terminate()
            dashboard.wait(timeout=10)

    assert depths.get("init") == 3
    assert page.status_code == 200 and "init" in page.text
    assert password not in argv and "--disable-delete" in argv
    assert password not in (tmp_path / "dashboard.log").read_text(errors="replace")
