"""What makes two sandboxes interchangeable before a job is known: the pool's key.

A sandbox's execution settings are fixed when it starts (backend, image, network, limits,
environment, where the workspace appears) and whether its IPython kernel was started ahead;
a job's files and setup commands are not (they are the workspace's, placed by init). Two
jobs with the same profile can take each other's ready sandboxes.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.config import Settings
from workers.sandbox.spec import SandboxLimits, SandboxSpec


@dataclass(frozen=True)
class SandboxProfile:
    backend: str
    image: str | None
    network: bool
    limits: tuple[tuple[str, int | None], ...]
    env: tuple[tuple[str, str], ...]
    workdir: str | None
    python: bool  # the kernel is started ahead (the job's kind has the `python` tool)

    @classmethod
    def of(cls, spec: SandboxSpec, settings: Settings, python: bool) -> SandboxProfile:
        """The profile a job's sandbox needs; limits resolved, so a default and its value are one profile."""
        limits = spec.limits.resolved(settings)
        return cls(
            backend=settings.sandbox_backend,
            image=spec.image,
            network=spec.network,
            limits=tuple(sorted(limits.model_dump().items())),
            env=tuple(sorted(spec.env.items())),
            workdir=spec.workdir,
            python=python,
        )

    def spec(self) -> SandboxSpec:
        """A spec that starts a sandbox of this profile (no files, no setup: those are the job's)."""
        return SandboxSpec(
            image=self.image,
            network=self.network,
            limits=SandboxLimits(**dict(self.limits)),
            env=dict(self.env),
            workdir=self.workdir,
        )
