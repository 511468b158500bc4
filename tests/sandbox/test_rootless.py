"""The rootless path (HPC): a non-root worker, bwrap in an unprivileged user namespace.

Run as root, the test drops to ``nobody`` and starts a sandbox from there with the
system interpreter of the same Python version and this venv's packages on the path
(the venv's own interpreter may sit under root's 0700 home). The process limit asked
for is above the inherited hard limit, which an unprivileged worker cannot raise: it
is clamped rather than failing the start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

import pytest

from shared.sandbox.local import PROJECT_ROOT

SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from shared.config import Settings
    from shared.sandbox import SandboxLimits, SandboxSpec, create_sandbox

    base = Path(sys.argv[1])
    settings = Settings(state_dir=base / "state", sandbox_require_isolation=True)
    spec = SandboxSpec(env={"PYTHONPATH": os.environ["PYTHONPATH"]}, limits=SandboxLimits(processes=10**9))
    with create_sandbox(spec, base / "ws", base / "rt", settings) as box:
        print(box.call("bash", {"command": "id -u; pwd; touch /usr/x 2>/dev/null || echo ro"}).output, end="")
        print(box.call("python", {"code": "import os; os.getuid()"}).output, end="")
        print(box.call("create", {"path": "made.txt", "file_text": "x"}).is_error)
    print((base / "rt").exists())
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason=f"{SYSTEM_PYTHON} is not installed")
def test_sandbox_as_an_unprivileged_user(require_bwrap: None) -> None:
    base = Path(tempfile.mkdtemp(prefix="sbx-rootless-"))
    try:
        os.chmod(base, 0o777)
        (base / "ws").mkdir()
        os.chown(base / "ws", 65534, 65534)
        path = f"{sysconfig.get_paths()['purelib']}:{PROJECT_ROOT}"
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp", f"PYTHONPATH={path}",
             SYSTEM_PYTHON, "-c", SCRIPT, str(base)],
            capture_output=True, text=True, timeout=120, cwd=base,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["65534", "/workspace", "ro", "65534", "False", "False"]
        assert os.stat(base / "ws" / "made.txt").st_uid == 65534
    finally:
        shutil.rmtree(base, ignore_errors=True)
