"""Workspace state across stages: place a task's files, copy, diff and re-apply.

init places files and runs setup in the workspace and keeps a pristine copy; eval
judges a fresh copy of that pristine state plus the agent's diff, so edits the
agent made outside its diff's reach (tests, .git, caches) cannot move the reward.
The diff is computed by git with a throwaway repository outside both trees: the
workspace's own ``.git`` (and its hooks or config) are never read.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from shared.errors import RolloutsError
from workers.toolserver.files import ToolError, Workspace

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "rollouts",
    "GIT_AUTHOR_EMAIL": "rollouts@localhost",
    "GIT_COMMITTER_NAME": "rollouts",
    "GIT_COMMITTER_EMAIL": "rollouts@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


class WorkspaceError(RolloutsError, RuntimeError):
    pass


def place_files(workspace: Path, files: dict[str, str]) -> None:
    """Write a task's files into the workspace; a path escaping it is an error."""
    tree = Workspace(workspace)
    for relative, text in files.items():
        try:
            tree.create(relative, text)
        except ToolError as exc:
            raise WorkspaceError(f"task file {relative!r}: {exc}") from exc


def copy_workspace(source: Path, destination: Path) -> None:
    """Copy a tree keeping symlinks as symlinks (never following them out of it)."""
    shutil.copytree(source, destination, symlinks=True)


def _git(git_dir: Path, work_tree: Path, *args: str, stdin: bytes | None = None) -> bytes:
    cmd = [
        "git",
        f"--git-dir={git_dir}",
        f"--work-tree={work_tree}",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "core.autocrlf=false",
        *args,
    ]
    done = subprocess.run(
        cmd, input=stdin, capture_output=True, cwd=work_tree, env={**os.environ, **_GIT_ENV}, check=False
    )
    if done.returncode != 0:
        raise WorkspaceError(f"git {args[0]} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def workspace_diff(baseline: Path, current: Path) -> bytes:
    """A binary git patch turning ``baseline`` into ``current`` (paths relative, .git excluded)."""
    with tempfile.TemporaryDirectory(prefix="ro-diff-") as tmp:
        git_dir = Path(tmp) / "repo.git"
        _git(git_dir, baseline, "init", "-q")
        _git(git_dir, baseline, "add", "-A", "--force", ".")
        _git(git_dir, baseline, "commit", "-q", "--allow-empty", "-m", "baseline")
        _git(git_dir, current, "add", "-A", "--force", ".")
        return _git(git_dir, current, "diff", "--cached", "--binary", "--no-renames", "HEAD")


def apply_diff(workspace: Path, patch: bytes) -> None:
    """Apply a patch from ``workspace_diff`` to a (fresh) workspace."""
    if not patch.strip():
        return
    with tempfile.TemporaryDirectory(prefix="ro-apply-") as tmp:
        git_dir = Path(tmp) / "repo.git"
        _git(git_dir, workspace, "init", "-q")
        _git(git_dir, workspace, "apply", "--binary", "--whitespace=nowarn", "-", stdin=patch)


def read_agent_file(workspace: Path, relative: str, max_bytes: int) -> str | None:
    """A file the agent wrote, read without following a symlink out of the workspace;
    None if it does not exist. Raises ValueError if it is unreadable, not a regular file (a FIFO
    would block the read forever, a device never end) or too large."""
    tree = Workspace(workspace, max_file_bytes=max_bytes)
    try:
        real = tree.resolve(relative)
    except ToolError as exc:
        raise ValueError(str(exc)) from None
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot open {relative}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ValueError(f"{relative} is {'a directory' if stat.S_ISDIR(mode) else 'not a regular file'}")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{relative} is larger than {max_bytes} bytes")
    return data.decode("utf-8", errors="replace")
