"""Fixtures for task-kind tests: sandbox settings, stage contexts, the example task sets."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shared.config import Settings
from shared.jobs.spec import JobRequest
from shared.tasks import StageContext
from workers.sandbox.local import bwrap_usable

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture()
def require_bwrap() -> None:
    usable, reason = bwrap_usable()
    if not usable:
        pytest.skip(f"bubblewrap cannot run here: {reason}")


@pytest.fixture()
def task_settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state", sandbox_require_isolation=True, tool_default_timeout_s=30)


MakeCtx = Callable[..., StageContext]


@pytest.fixture()
def make_ctx(tmp_path: Path, task_settings: Settings) -> MakeCtx:
    """A StageContext for `task` at `stage`, with `outputs` from earlier stages; one workspace per test."""

    def make(
        task: dict[str, Any], stage: str = "eval", outputs: dict[str, Any] | None = None, seconds: float = 300.0
    ) -> StageContext:
        return StageContext(
            job_id="job-1",
            stage=stage,
            request=JobRequest(task=task),
            outputs=outputs or {},
            workspace=tmp_path / "workspace",
            settings=task_settings,
            deadline=time.time() + seconds,
        )

    return make


def example_rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (EXAMPLES / name).read_text().splitlines() if line.strip()]


def rollout(final_text: str = "", answer: str | None = None, **extra: Any) -> dict[str, Any]:
    """The fields of a trajectory that evaluators read."""
    return {"rollout": {"final_text": final_text, "answer": answer, "extra": extra}}
