"""The README's main command end to end: `rollouts run examples/mixed.jsonl` on the embedded default
(CPU model, local sandboxes). With a tiny random model rewards are near 0; what must hold is that
every job of every kind ends `done` with its kind's evaluation details, never `failed`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DETAIL_KEYS = {"math": "reference", "stem": "reference", "code": "scoring", "swe": "resolved"}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("require_bwrap")]


def test_mixed_batch_runs_through_the_whole_stack(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTS_")}
    env["ROLLOUTS_STATE_DIR"] = str(tmp_path / "state")
    result = subprocess.run(
        [sys.executable, "-m", "cli", "run", str(ROOT / "examples" / "mixed.jsonl"), "--output", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.split()[:1] != []}
    for kind in DETAIL_KEYS:
        assert rows[kind][1] == rows[kind][2], (kind, rows[kind])  # jobs == done
    jobs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(jobs) == 8
    for job in jobs:
        assert job["status"] == "done", (job["kind"], job.get("error"))
        evaluation = job["result"]["evaluation"]
        assert 0.0 <= evaluation["reward"] <= 1.0
        assert DETAIL_KEYS[job["kind"]] in evaluation, evaluation
