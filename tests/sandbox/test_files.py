"""File tools stay inside the workspace, symlinks included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.toolserver.files import ToolError, Workspace


@pytest.fixture()
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("secret\n")
    return Workspace(root)


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "a/../../secret.txt", "", "x\x00y"])
def test_paths_outside_are_refused(ws: Workspace, path: str) -> None:
    with pytest.raises(ToolError):
        ws.view(path)
    with pytest.raises(ToolError):
        ws.create(path, "owned")


def test_symlinks_out_of_the_workspace_are_refused(ws: Workspace) -> None:
    os.symlink(ws.root.parent / "secret.txt", ws.root / "link.txt")
    os.symlink(ws.root.parent, ws.root / "up")
    for path in ("link.txt", "up/secret.txt"):
        with pytest.raises(ToolError, match="outside the workspace"):
            ws.view(path)
    with pytest.raises(ToolError):
        ws.create("up/new.txt", "x")
    with pytest.raises(ToolError):
        ws.str_replace("link.txt", "secret", "changed")
    assert (ws.root.parent / "secret.txt").read_text() == "secret\n"
    assert not (ws.root.parent / "new.txt").exists()


def test_symlink_inside_is_followed(ws: Workspace) -> None:
    (ws.root / "real.txt").write_text("a\nb\n")
    os.symlink("real.txt", ws.root / "alias.txt")
    assert "a" in ws.view("alias.txt")


def test_create_view_ranges_and_replace(ws: Workspace) -> None:
    assert "Created" in ws.create("pkg/mod.py", "one\ntwo\nthree\nfour\n")
    assert "Overwrote" in ws.create(str(ws.root / "pkg/mod.py"), "one\ntwo\nthree\nfour\n")
    view = ws.view("pkg/mod.py", [2, 3])
    assert "2\ttwo" in view and "3\tthree" in view and "one" not in view
    assert "4\tfour" in ws.view("pkg/mod.py", [3, -1])
    with pytest.raises(ToolError):
        ws.view("pkg/mod.py", [0, 2])
    with pytest.raises(ToolError):
        ws.view("pkg/mod.py", [3, 2])
    assert "mod.py" in ws.view("pkg")
    ws.str_replace("pkg/mod.py", "two\n", "TWO\n")
    assert (ws.root / "pkg/mod.py").read_text() == "one\nTWO\nthree\nfour\n"


def test_replace_needs_one_exact_match(ws: Workspace) -> None:
    ws.create("f.txt", "x = 1\nx = 1\n")
    with pytest.raises(ToolError, match="2 times"):
        ws.str_replace("f.txt", "x = 1", "x = 2")
    with pytest.raises(ToolError, match="does not occur"):
        ws.str_replace("f.txt", "y", "z")
    with pytest.raises(ToolError):
        ws.view("missing.txt")


def test_a_fifo_is_refused_without_blocking(ws: Workspace) -> None:
    """Opening a FIFO would block forever while holding the files lock; it is not a file."""
    os.mkfifo(ws.root / "pipe")
    with pytest.raises(ToolError, match="not a regular file"):
        ws.view("pipe")
    with pytest.raises(ToolError, match="not a regular file"):
        ws.str_replace("pipe", "a", "b")
    reader = os.open(ws.root / "pipe", os.O_RDONLY | os.O_NONBLOCK)  # with a reader, a write open succeeds
    try:
        with pytest.raises(ToolError, match="not a regular file"):
            ws.create("pipe", "text")
    finally:
        os.close(reader)
    with pytest.raises(ToolError):  # no reader: the non-blocking open fails at once
        ws.create("pipe", "text")


def test_str_replace_refuses_a_file_that_is_not_utf8(ws: Workspace) -> None:
    original = b"caf\xe9 latin-1\nkeep \xff this\n"
    (ws.root / "latin1.txt").write_bytes(original)
    with pytest.raises(ToolError, match="not valid UTF-8"):
        ws.str_replace("latin1.txt", "keep", "kept")
    assert (ws.root / "latin1.txt").read_bytes() == original
    assert "caf\ufffd" in ws.view("latin1.txt"), "viewing still works, with replacement characters"


def test_create_refuses_unencodable_text_and_keeps_the_file(ws: Workspace) -> None:
    (ws.root / "a.txt").write_text("before\n")
    with pytest.raises(ToolError, match="not valid UTF-8"):
        ws.create("a.txt", "bad \ud800 text")
    assert (ws.root / "a.txt").read_text() == "before\n"
    assert ws.create("a.txt", "after\n").startswith("Overwrote")
    assert (ws.root / "a.txt").read_text() == "after\n"


_WRITE_PAST_LIMIT = """
import json, resource, signal, sys
from pathlib import Path
from workers.toolserver.files import ToolError, Workspace
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as in the sandbox: a write past the limit gets EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
ws = Workspace(Path(sys.argv[1]))
out = {}
for name, call in (("create", lambda: ws.create("notes.txt", "x" * 10000)),
                   ("str_replace", lambda: ws.str_replace("notes.txt", "original", "y" * 10000))):
    try:
        call()
        out[name] = "written"
    except ToolError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def test_a_write_that_fails_halfway_leaves_the_file_whole(ws: Workspace) -> None:
    """A full disk or the file-size limit mid-write: an error for the agent, the old file untouched, no debris."""
    import json
    import subprocess
    import sys

    (ws.root / "notes.txt").write_text("original text\n")
    os.chmod(ws.root / "notes.txt", 0o600)
    result = subprocess.run(
        [sys.executable, "-c", _WRITE_PAST_LIMIT, str(ws.root)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    errors = json.loads(result.stdout)
    for name in ("create", "str_replace"):
        assert "File too large" in errors[name] and "unchanged" in errors[name], errors
    assert (ws.root / "notes.txt").read_text() == "original text\n"
    assert sorted(p.name for p in ws.root.iterdir()) == ["notes.txt"]


def test_overwriting_keeps_the_file_mode(ws: Workspace) -> None:
    (ws.root / "run.sh").write_text("echo old\n")
    os.chmod(ws.root / "run.sh", 0o755)
    ws.create("run.sh", "echo new\n")
    assert (ws.root / "run.sh").read_text() == "echo new\n"
    assert (ws.root / "run.sh").stat().st_mode & 0o777 == 0o755
