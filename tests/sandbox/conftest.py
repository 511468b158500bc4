"""Fixtures for real sandboxes: settings with small limits, short runtime dirs, a started sandbox
(and one given network access)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.config import Settings
from workers.sandbox import Sandbox, SandboxSpec, create_sandbox
from workers.sandbox.local import bwrap_usable
from workers.sandbox.owner import start_ticks


def pid_namespace_members(ns: str) -> list[int]:
    """Pids (as seen here) of every process whose pid namespace is ``ns`` ("pid:[...]")."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                    members.append(int(entry))
            except OSError:
                continue
    return members


def namespace_processes(ns: str) -> set[tuple[int, int | None]]:
    """(pid, start ticks) of every member of pid namespace ``ns`` now: what names them after it is gone,
    when a new namespace (another test's sandbox) may have been given the same inode number."""
    return {(pid, start_ticks(pid)) for pid in pid_namespace_members(ns)}


def still_running(processes: set[tuple[int, int | None]]) -> list[int]:
    """The pids of ``processes`` (from ``namespace_processes``) that still run: same pid, same start."""
    return sorted(pid for pid, start in processes if start is not None and start_ticks(pid) == start)


@pytest.fixture()
def sandbox_settings(tmp_path: Path) -> Settings:
    return Settings(
        state_dir=tmp_path / "state",
        sandbox_require_isolation=True,
        sandbox_processes=64,
        sandbox_memory_bytes=2 * 1024**3,
        sandbox_cpu_seconds=120,
        tool_output_cap_bytes=2000,
        tool_hard_output_bytes=200_000,
        tool_default_timeout_s=20,
        tool_max_timeout_s=30,
    )


@pytest.fixture()
def require_bwrap() -> None:
    usable, reason = bwrap_usable()
    if not usable:
        pytest.skip(f"bubblewrap cannot run here: {reason}")


@pytest.fixture()
def workspace(short_dir: Path) -> Path:
    path = short_dir / "ws"
    path.mkdir()
    return path


@pytest.fixture()
def sandbox(require_bwrap: None, workspace: Path, short_dir: Path, sandbox_settings: Settings) -> Iterator[Sandbox]:
    box = create_sandbox(SandboxSpec(), workspace, short_dir / "rt", sandbox_settings)
    box.start()
    yield box
    box.stop()


@pytest.fixture()
def require_slirp() -> None:
    if shutil.which("slirp4netns") is None:
        pytest.skip("slirp4netns is not installed (Debian package slirp4netns)")


@pytest.fixture()
def net_sandbox(
    require_bwrap: None, require_slirp: None, workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> Iterator[Sandbox]:
    """A started sandbox whose task asks for network access (slirp4netns)."""
    box = create_sandbox(SandboxSpec(network=True), workspace, short_dir / "rt", sandbox_settings)
    box.start()
    yield box
    box.stop()
