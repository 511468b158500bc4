"""Reading the files the agent left: never blocks, never follows a link out, only regular files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from workers.sandbox.workspace import read_agent_file


def _read_in_thread(workspace: Path, name: str) -> list[object]:
    """read_agent_file in a daemon thread, so a regression (a blocking open) fails instead of hanging."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(read_agent_file(workspace, name, 1024))
        except ValueError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)  # a hang guard, not a speed check: the read returns at once when it works
    assert not thread.is_alive(), "reading a FIFO blocked"
    return outcome


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "solution.py")
    [outcome] = _read_in_thread(tmp_path, "solution.py")
    assert isinstance(outcome, ValueError) and "not a regular file" in str(outcome)


def test_regular_missing_directory_and_too_large(tmp_path: Path) -> None:
    (tmp_path / "solution.py").write_text("print(1)\n")
    (tmp_path / "big.py").write_text("x" * 2048)
    (tmp_path / "pkg").mkdir()
    assert read_agent_file(tmp_path, "solution.py", 1024) == "print(1)\n"
    assert read_agent_file(tmp_path, "absent.py", 1024) is None
    with pytest.raises(ValueError, match="directory"):
        read_agent_file(tmp_path, "pkg", 1024)
    with pytest.raises(ValueError, match="larger than"):
        read_agent_file(tmp_path, "big.py", 1024)
