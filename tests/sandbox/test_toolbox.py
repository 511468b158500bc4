"""The ToolBox dispatch on its own (no sandbox): timeouts and caps as the agent can send them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.toolserver.tools import ToolBox, ToolLimits


@pytest.fixture()
def toolbox(tmp_path: Path) -> Iterator[ToolBox]:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    box = ToolBox(
        ws,
        tmp_path / "state",
        env,
        ToolLimits(output_cap=1000, hard_output_cap=20_000, default_timeout_s=20, max_timeout_s=30),
    )
    box.start()
    yield box
    box.close()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0, None])
def test_non_finite_or_non_positive_timeouts_mean_the_default(toolbox: ToolBox, bad: float | None) -> None:
    assert toolbox._timeout({"timeout": bad}, None) == 20
    assert toolbox._timeout({}, bad) == 20


def test_nan_timeout_from_json_keeps_the_shell_in_sync(toolbox: ToolBox) -> None:
    args = json.loads('{"command": "echo one", "timeout": NaN}')
    first = toolbox.call("bash", args)
    assert first.output == "one\n" and first.exit_code == 0 and not first.is_error
    assert toolbox.call("bash", {"command": "echo two"}).output == "two\n"


def test_python_runaway_output_is_reported_like_bash(toolbox: ToolBox) -> None:
    result = toolbox.call("python", {"code": "while True: print('x' * 500)"})
    assert result.truncated and result.is_error and not result.timed_out
    assert "[output exceeded 20000 bytes; the execution was interrupted]" in result.output
    assert len(result.output) < 2000
    assert toolbox.call("python", {"code": "6 * 7"}).output == "42\n"
