"""Holding a simulated stage until a test lets it go: the `hold` task option of the test kinds.

A test that needs a job still running at some moment holds it there by a mechanism, not by a
sleep long enough on the machine it was written on: `hold: {stage: path}` keeps that stage
waiting until the file at `path` exists, which the test creates once it has seen what it needs.
The wait is cooperative (`ctx.sleep`), so a cancel or a time limit still ends a held stage.
Used by `dapo_sim` (bench/dapo_kind.py) and `scripted` (tests/support/kinds.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.tasks import StageContext, TaskValidationError

POLL_S = 0.05


def validate_hold(task: dict[str, Any]) -> None:
    """Refuse a malformed `hold` at submission, not as a stage failure later."""
    hold = task.get("hold", {})
    if not isinstance(hold, dict) or not all(isinstance(path, str) for path in hold.values()):
        raise TaskValidationError("task.hold: a map of stage -> path of a file that releases the stage")


def hold_stage(ctx: StageContext) -> None:
    """Wait while this stage's release file (if the task names one) does not exist yet."""
    path = (ctx.task.get("hold") or {}).get(ctx.stage)
    if not path:
        return
    release = Path(path)
    while not release.exists():
        ctx.sleep(POLL_S)  # raises StageInterrupted on a cancel, a hand-back or the deadline
