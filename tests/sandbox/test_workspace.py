"""Workspace helpers: task files, copies, and the agent's diff applied to a fresh copy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.sandbox.workspace import WorkspaceError, apply_diff, copy_workspace, place_files, workspace_diff


def _tree(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            path = Path(dirpath, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                out[key] = ("link", os.readlink(path))
            else:
                out[key] = (path.read_bytes(), os.access(path, os.X_OK))
    return out


def test_place_files_is_confined(tmp_path: Path) -> None:
    place_files(tmp_path, {"src/a.py": "A = 1\n", "README": "hi\n"})
    assert (tmp_path / "src/a.py").read_text() == "A = 1\n"
    with pytest.raises(WorkspaceError):
        place_files(tmp_path / "src", {"../../escape.txt": "x"})
    assert not (tmp_path.parent / "escape.txt").exists()


def test_agent_diff_applied_to_a_fresh_copy_reproduces_the_work(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    files = {"pkg/mod.py": "def f():\n    return 1\n", "tests/test_mod.py": "assert True\n", "old.txt": "bye\n"}
    place_files(pristine, files)
    (pristine / "data.bin").write_bytes(bytes(range(256)))
    agent = tmp_path / "agent"
    copy_workspace(pristine, agent)
    (agent / "pkg/mod.py").write_text("def f():\n    return 2\n")
    (agent / "new.sh").write_text("echo new\n")
    os.chmod(agent / "new.sh", 0o755)
    (agent / "old.txt").unlink()
    (agent / "data.bin").write_bytes(bytes(reversed(range(256))))
    os.symlink("pkg/mod.py", agent / "alias.py")
    (agent / ".git").mkdir()  # the agent's own git state is never read
    (agent / ".git" / "config").write_text("[core]\n\thooksPath = /tmp/evil\n")

    patch = workspace_diff(pristine, agent)
    fresh = tmp_path / "fresh"
    copy_workspace(pristine, fresh)
    apply_diff(fresh, patch)
    assert _tree(fresh) == _tree(agent)
    assert _tree(pristine)["pkg/mod.py"] == (b"def f():\n    return 1\n", False)


def test_no_change_is_an_empty_diff(tmp_path: Path) -> None:
    place_files(tmp_path / "a", {"x": "1\n"})
    copy_workspace(tmp_path / "a", tmp_path / "b")
    assert workspace_diff(tmp_path / "a", tmp_path / "b") == b""
    apply_diff(tmp_path / "b", b"")
