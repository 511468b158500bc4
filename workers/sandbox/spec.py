"""What a job asks of its sandbox, and what running something in it returns."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from shared.config import Settings


class SandboxLimits(BaseModel):
    """Per-process resource limits (rlimits), and the disk quota of the sandbox's writable trees
    (workspace and /tmp together, ``workers/sandbox/quota.py``). None: the deployment's default."""

    cpu_seconds: int | None = Field(default=None, gt=0)
    memory_bytes: int | None = Field(default=None, gt=0)
    processes: int | None = Field(default=None, gt=0)
    file_size_bytes: int | None = Field(default=None, gt=0)
    disk_bytes: int | None = Field(default=None, gt=0)

    def resolved(self, settings: Settings) -> SandboxLimits:
        return SandboxLimits(
            cpu_seconds=self.cpu_seconds or settings.sandbox_cpu_seconds,
            memory_bytes=self.memory_bytes or settings.sandbox_memory_bytes,
            processes=self.processes or settings.sandbox_processes,
            file_size_bytes=self.file_size_bytes or settings.sandbox_file_size_bytes,
            disk_bytes=self.disk_bytes or settings.sandbox_disk_bytes,
        )


class SandboxSpec(BaseModel):
    """A task's sandbox, as written in the job (``task["sandbox"]``).

    ``files`` maps workspace-relative paths to their text, placed by init;
    ``setup`` are shell commands init runs in the sandbox after placing them.
    ``image`` only matters to the Singularity backend (a .sif path, or a
    ``docker://``/``oras://``/``library://`` URI pulled once into the image cache).
    """

    image: str | None = None
    setup: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    network: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(
        default=None, description="Where an image backend binds the workspace (an image built for /testbed)."
    )


@dataclass
class ExecResult:
    """Outcome of one non-interactive command (setup script, test run)."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out
