"""The real CLI when something outside it fails: one line that says what, where and what to do, and an exit code.

Against a closed port, a real API that wants another token, and a real API that refuses input.
`--verbose` still shows the traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import failures
from cli.embedded_redis import free_port
from tests.support.live_api import running_api

ROLLOUTS = [sys.executable, "-m", "cli"]
ROOT = Path(__file__).resolve().parents[2]


def rollouts(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTS_")}
    return subprocess.run(
        [*ROLLOUTS, *args], env={**clean, **env}, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("rollouts: ")
    return lines[0]


@pytest.fixture(scope="module")
def live_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`rollouts api` over its own redis-server, with a token required."""
    with running_api(tmp_path_factory.mktemp("cli-failures"), ROLLOUTS_API_TOKENS="right-token") as url:
        yield url


def test_api_unreachable_is_one_line_naming_the_url_and_exit_3():
    url = f"http://127.0.0.1:{free_port()}"
    result = rollouts("status", ROLLOUTS_API_URL=url)

    line = one_line(result)
    assert result.returncode == failures.API_UNREACHABLE == 3
    assert url in line and "connection refused" in line and "ROLLOUTS_API_URL" in line


def test_verbose_shows_the_traceback():
    result = rollouts("--verbose", "status", ROLLOUTS_API_URL=f"http://127.0.0.1:{free_port()}")
    assert result.returncode != 0 and "Traceback" in result.stderr and "ConnectError" in result.stderr


def test_a_wrong_token_is_one_line_saying_which_setting_and_exit_4(live_api):
    result = rollouts("status", ROLLOUTS_API_URL=live_api, ROLLOUTS_TOKEN="wrong-token")

    line = one_line(result)
    assert result.returncode == failures.NOT_ALLOWED == 4
    assert "401" in line and "ROLLOUTS_TOKEN" in line and live_api in line


def test_refused_rows_name_each_row_and_exit_5(live_api, tmp_path):
    rows = tmp_path / "jobs.jsonl"
    rows.write_text('{"task": {"kind": "demo", "text": "ok"}}\n{"task": {"kind": "nope"}}\n')

    result = rollouts("submit", str(rows), "--no-wait", ROLLOUTS_API_URL=live_api, ROLLOUTS_TOKEN="right-token")

    assert result.returncode == failures.REFUSED == 5, result.stderr
    assert "Traceback" not in result.stderr
    assert "row 2: task.kind: unknown task kind 'nope'" in result.stderr


def test_a_command_that_works_still_exits_0(live_api):
    result = rollouts("status", ROLLOUTS_API_URL=live_api, ROLLOUTS_TOKEN="right-token")
    assert result.returncode == 0, result.stderr
    assert "stage" in result.stdout
