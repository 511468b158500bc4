"""Hand a pooled sandbox's workspace to a job, and take it back empty, by renaming directories.

A sandbox binds one host directory at its ``workdir`` when it starts, before any job is known.
A bind mount follows the directory, not its name, so the pool starts each sandbox over a
directory of its own (``<workspaces>/.pool/<id>``) and, when a job takes it, moves the job's
files in and renames that directory to the job's workspace path: the job's state is where the
stages expect it, and nothing is copied. Renames stay on one filesystem (both live under the
workspaces root); one that fails leaves the job's workspace as it was.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from workers.sandbox.sandbox import Sandbox, SandboxError


class HandoffError(SandboxError):
    """The pooled sandbox could not be given the job's workspace (or its own back): discard it."""


def _move_entries(source: Path, target: Path) -> None:
    for entry in os.scandir(source):
        os.rename(entry.path, target / entry.name)


def move_in(sandbox: Sandbox, job_workspace: Path) -> None:
    """Make the sandbox's own (empty) workspace directory the job's, holding the job's files."""
    own = sandbox.workspace
    aside = job_workspace.with_name(f".{job_workspace.name}.in-{uuid.uuid4().hex[:8]}")
    had_files = job_workspace.exists()
    try:
        if had_files:
            os.rename(job_workspace, aside)
        try:
            os.rename(own, job_workspace)
        except OSError:
            if had_files:
                os.rename(aside, job_workspace)
            raise
        if had_files:
            _move_entries(aside, job_workspace)
            os.rmdir(aside)
    except OSError as exc:
        raise HandoffError(f"cannot hand the pooled sandbox the workspace {job_workspace}: {exc}") from exc
    sandbox.rebind_workspace(job_workspace)


def move_out(sandbox: Sandbox, job_workspace: Path, own: Path) -> None:
    """Leave the job's files at its workspace path (eval reads them) and give the sandbox back its own
    directory, at ``own``, empty. On failure the job's files are all at ``job_workspace`` again."""
    fresh = job_workspace.with_name(f".{job_workspace.name}.out-{uuid.uuid4().hex[:8]}")
    try:
        fresh.mkdir()
    except OSError as exc:
        raise HandoffError(f"cannot take the pooled sandbox's workspace back: {exc}") from exc
    try:
        _move_entries(job_workspace, fresh)
        os.rename(job_workspace, own)
    except OSError as exc:
        try:  # put back what moved, so the job's workspace is whole for eval
            _move_entries(fresh, job_workspace)
            os.rmdir(fresh)
        except OSError:
            pass
        raise HandoffError(f"cannot take the pooled sandbox's workspace back: {exc}") from exc
    os.rename(fresh, job_workspace)
    sandbox.rebind_workspace(own)
    if any(os.scandir(own)):
        raise HandoffError(f"the pooled sandbox's workspace {own} is not empty after the job's files left")
