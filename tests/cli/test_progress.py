"""Progress without a terminal: plain lines a log keeps, with counts, rate and ETA; a terminal gets the bar."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from cli.progress import Progress

ROOT = Path(__file__).resolve().parents[2]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_a_terminal_each_interval_prints_one_plain_line():
    log = io.StringIO()
    progress = Progress(total=4, unit="job", interval_s=0.0, stream=log)

    progress.update(1, ended={"done": 1}, running={"rollout": 2, "eval": 1})
    progress.update(3, ended={"done": 3, "failed": 1}, running={})
    progress.close()

    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0].startswith("progress: 1/4 jobs (done 1), in flight 3 (eval 1, rollout 2), ")
    assert "/s, ETA " in lines[0]
    assert lines[-1].startswith("progress: 4/4 jobs (done 3, failed 1), ") and "ETA" not in lines[-1]


def test_lines_are_spaced_by_the_interval():
    log = io.StringIO()
    progress = Progress(total=100, unit="job", interval_s=3600.0, stream=log)
    for _ in range(50):
        progress.update(1)
    assert log.getvalue() == ""  # nothing until an interval has passed
    progress.close()
    assert log.getvalue().count("\n") == 1  # and the final figures once


def test_a_terminal_gets_the_bar_not_lines():
    screen = FakeTerminal()
    progress = Progress(total=2, unit="job", interval_s=0.0, stream=screen)
    progress.update(2, ended={"done": 2})
    progress.close()
    assert "progress:" not in screen.getvalue() and "2/2" in screen.getvalue()


def test_rollouts_run_into_a_log_file_writes_progress_lines(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTS_")}
    env.update(ROLLOUTS_STATE_DIR=str(tmp_path / "state"), ROLLOUTS_PROGRESS_INTERVAL_S="0.5")
    result = subprocess.run(
        [sys.executable, "-m", "cli", "run", str(ROOT / "examples" / "demo.jsonl")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    jobs = len((ROOT / "examples" / "demo.jsonl").read_text().splitlines())
    lines = [line for line in result.stderr.splitlines() if line.startswith("progress: ")]
    assert lines and lines[-1].startswith(f"progress: {jobs}/{jobs} jobs (done {jobs})"), result.stderr
