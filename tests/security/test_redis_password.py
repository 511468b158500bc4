"""A Redis with `requirepass`: the whole stack runs against it and the password shows up nowhere."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis
from redis.exceptions import AuthenticationError, ResponseError

from cli.embedded_redis import EmbeddedRedis, free_port
from cli.stack import Stack
from shared.config import Settings
from shared.redis_conn import redact_url
from tests.pipeline.conftest import FAST_RECOVERY_ENV
from tests.support.waiting import wait_for, wait_status

PASSWORD = "pw-Zq81-never-printed"


@pytest.fixture()
def protected_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(data_dir=tmp_path / "redis", password=PASSWORD).start()
    yield server
    server.stop()


def test_redact_url_hides_only_the_password():
    assert redact_url("redis://:s3@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("rediss://user:s3@[::1]:6380/2") == "rediss://user:***@[::1]:6380/2"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
    assert redact_url(None) == ""


def test_a_stack_on_a_password_protected_redis_runs_jobs_and_never_logs_the_password(protected_redis, tmp_path):
    assert PASSWORD in protected_redis.url
    settings = Settings(redis_url=protected_redis.url, state_dir=tmp_path / "state")
    logs = tmp_path / "logs"
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": 1, "rollout": 1, "eval": 1},
        log_dir=logs,
        extra_env={**FAST_RECOVERY_ENV, "ROLLOUTS_LOG_LEVEL": "DEBUG"},
    )
    with stack:
        stack.wait_for_workers()
        api = httpx.Client(base_url=stack.api_url, timeout=10.0)
        job_id = api.post("/v1/jobs", json={"task": {"kind": "scripted", "fail": "eval"}}).json()["job_ids"][0]
        record = wait_status(api, job_id)
        pages = [api.get(path).text for path in ("/v1/status", "/healthz", f"/v1/jobs/{job_id}", "/openapi.json")]

    assert record["status"] == "failed" and record["error"]["stage"] == "eval"
    for page in pages:
        assert PASSWORD not in page
    written = list(logs.glob("*.log")) + list((tmp_path / "redis").glob("*.log"))
    assert written
    for path in written:
        assert PASSWORD not in path.read_text(errors="replace"), path.name


def test_a_wrong_password_is_a_503_that_does_not_echo_the_url(protected_redis, make_client):
    wrong = protected_redis.url.replace(PASSWORD, "wrong-secret-value")
    client = make_client(redis_url=wrong)
    response = client.get("/v1/status")
    assert response.status_code == 503
    assert "wrong-secret-value" not in response.text and PASSWORD not in response.text
    assert client.get("/healthz").status_code == 503


def test_rollouts_up_prints_the_redis_address_with_the_password_redacted(protected_redis, tmp_path):
    port = free_port()
    env = {**os.environ, "ROLLOUTS_REDIS_URL": protected_redis.url, "ROLLOUTS_STATE_DIR": str(tmp_path / "state")}
    log_path = tmp_path / "up.log"
    with open(log_path, "w") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "cli", "up", "--port", str(port), "--no-vllm"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            banner = wait_for(
                lambda: next((line for line in log_path.read_text().splitlines() if line.startswith("  redis ")), None),
                timeout=90,
                what="the `rollouts up` banner's Redis line",
            )
        finally:
            up.send_signal(signal.SIGINT)
            try:
                code = up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                up.kill()  # never leave the stack running past a failed test
                up.wait()
                raise
    assert redact_url(protected_redis.url) in banner and ":***@" in banner
    assert code == 0
    assert PASSWORD not in log_path.read_text()


def test_the_embedded_redis_has_a_random_password_on_loopback_and_only_a_0600_file_holds_its_url(tmp_path):
    settings = Settings(redis_url=None, state_dir=tmp_path / "state")
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": 1, "rollout": 1, "eval": 1},
        log_dir=tmp_path / "logs",
        extra_env=FAST_RECOVERY_ENV,
    )
    with stack:
        stack.wait_for_workers()
        assert stack.redis is not None and stack.redis_url_file is not None
        password = stack.redis.password
        assert password and len(password) >= 32 and password in stack.redis_url
        assert stat.S_IMODE(stack.redis_url_file.stat().st_mode) == 0o600
        assert stack.redis_url_file.read_text().strip() == stack.redis_url
        with pytest.raises((AuthenticationError, ResponseError)):
            Redis(port=stack.redis.port).ping()  # no password: refused
        with Redis.from_url(stack.redis_url) as client:
            assert client.config_get("bind")["bind"] == "127.0.0.1"
        # The stack's processes read the file: the password is in no argv and no environment.
        for process in stack.children():
            for view in ("cmdline", "environ"):
                assert password.encode() not in Path(f"/proc/{process.pid}/{view}").read_bytes(), view
        api = httpx.Client(base_url=stack.api_url, timeout=10.0)
        job_id = api.post("/v1/jobs", json={"task": {"kind": "scripted"}}).json()["job_ids"][0]
        assert wait_status(api, job_id)["status"] == "done"
        status = subprocess.run(
            [sys.executable, "-m", "cli", "status"],
            env={**stack.env, "ROLLOUTS_API_URL": stack.api_url},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        url_file = stack.redis_url_file
    assert status.returncode == 0, status.stderr
    assert "rollout" in status.stdout and "done 1" in status.stdout
    assert password not in status.stdout + status.stderr
    assert not url_file.exists()  # removed with the stack
