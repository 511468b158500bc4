"""The test's side of a held stage (bench/hold.py): a release file the test creates when it is ready."""

from __future__ import annotations

from pathlib import Path


class Gate:
    """A release file: `gate.hold("rollout")` is the task option that holds the stage until
    `gate.release()`; one gate can hold many jobs, and all go on at once."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def hold(self, *stages: str) -> dict[str, dict[str, str]]:
        """The task fields that hold `stages` until this gate is released."""
        return {"hold": {stage: str(self.path) for stage in stages}}

    def release(self) -> None:
        self.path.touch()
