"""The sandbox image carries only the files its definition lists: the tool server must start from them.

Building the image needs apptainer; this test lays out exactly what `%files` in
singularity/sandbox.def copies and imports the tool server from that tree alone, so a
new import of a module the image lacks fails here rather than in a cluster's sandbox.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFINITION = ROOT / "singularity" / "sandbox.def"
IMAGE_SRC = "/opt/rollouts/src/"


def _files_section(text: str) -> list[tuple[str, str]]:
    """The (source, destination) lines of the definition's %files section."""
    pairs, inside = [], False
    for line in text.splitlines():
        if line.startswith("%"):
            inside = line.strip() == "%files"
            continue
        if inside and line.strip() and not line.lstrip().startswith("#"):
            source, destination = line.split()
            pairs.append((source, destination))
    return pairs


def test_the_tool_server_imports_from_the_files_the_image_copies(tmp_path):
    pairs = _files_section(DEFINITION.read_text())
    assert pairs, "no %files section in sandbox.def"
    for source, destination in pairs:
        assert destination.startswith(IMAGE_SRC), destination
        target = tmp_path / destination[len(IMAGE_SRC) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, target)
        else:
            shutil.copy2(ROOT / source, target)

    # -I: no user site, no PYTHONPATH, no current directory. The project is also installed (editable) in
    # this environment, so what counts is where each of its modules was loaded from: the copied tree.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import runpy, workers.toolserver.server; "
        "runpy.run_module('workers.toolserver', run_name='probe'); "
        "print(repr({m.__name__: m.__file__ for m in list(sys.modules.values()) "
        "if m.__name__.split('.')[0] in ('shared', 'workers', 'api', 'cli')}))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert "workers.toolserver.server" in loaded
    outside = {name: path for name, path in loaded.items() if not Path(path).resolve().is_relative_to(tmp_path)}
    assert not outside, f"the tool server needs modules that sandbox.def does not copy: {outside}"
