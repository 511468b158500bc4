"""Sandboxes: one interface, a local (bubblewrap) and a Singularity/Apptainer backend.

Stages use ``create_sandbox(spec, workspace, runtime_dir, settings)`` and the
returned Sandbox's ``start/call/exec/stop``; the agent loop puts
``TOOL_SCHEMAS`` in its chat template.
"""

from __future__ import annotations

from pathlib import Path

from shared.config import Settings
from shared.tool_schemas import TOOL_NAMES, TOOL_SCHEMAS
from workers.sandbox.sandbox import Sandbox, SandboxError
from workers.sandbox.spec import ExecResult, SandboxLimits, SandboxSpec
from workers.toolserver.result import ToolResult


def create_sandbox(spec: SandboxSpec, workspace: Path, runtime_dir: Path, settings: Settings) -> Sandbox:
    """A not-yet-started sandbox of the configured backend over ``workspace``."""
    if settings.sandbox_backend == "singularity":
        from workers.sandbox.singularity import SingularitySandbox

        return SingularitySandbox(spec, workspace, runtime_dir, settings)
    from workers.sandbox.local import LocalSandbox

    return LocalSandbox(spec, workspace, runtime_dir, settings)


__all__ = [
    "TOOL_NAMES",
    "TOOL_SCHEMAS",
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxSpec",
    "ToolResult",
    "create_sandbox",
]
