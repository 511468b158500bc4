"""The rootless path (HPC): a non-root worker, bwrap in an unprivileged user namespace.

Run as root, the test drops to ``nobody`` and starts a sandbox from there with the
system interpreter of the same Python version and this venv's packages and the project on
the path, bind-mounted where ``nobody`` can reach them (the venv's own interpreter may sit
under root's 0700 home, and CI clones into a private directory). The process limit asked
for is above the inherited hard limit, which an unprivileged worker cannot raise: it
is clamped rather than failing the start.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from workers.sandbox.local import PROJECT_ROOT

SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from shared.config import Settings
    from workers.sandbox import SandboxLimits, SandboxSpec, create_sandbox

    base = Path(sys.argv[1])
    settings = Settings(state_dir=base / "state", sandbox_require_isolation=True)
    spec = SandboxSpec(env={"PYTHONPATH": os.environ["PYTHONPATH"]}, limits=SandboxLimits(processes=10**9))
    with create_sandbox(spec, base / "ws", base / "rt", settings) as box:
        print(box.call("bash", {"command": "id -u; pwd; touch /usr/x 2>/dev/null || echo ro"}).output, end="")
        print(box.call("python", {"code": "import os; os.getuid()"}).output, end="")
        print(box.call("create", {"path": "made.txt", "file_text": "x"}).is_error)
    print((base / "rt").exists())

    # The disk quota holds rootless: a dd loop into /tmp, and a big file hidden in a directory made
    # unreadable (chmod 0) in the workspace, each past a 16 MiB quota.
    from workers.sandbox.sandbox import SandboxDiskQuotaExceeded
    writers = [
        "for i in $(seq 4096); do dd if=/dev/zero of=/tmp/f$i bs=1M count=1 status=none; done",
        "mkdir h && head -c 40000000 /dev/zero > h/big; chmod 0 h; sleep 60",
    ]
    for n, command in enumerate(writers):
        limits = SandboxLimits(processes=10**9, disk_bytes=16 * 2**20)
        box = create_sandbox(SandboxSpec(env=spec.env, limits=limits), base / "ws", base / f"rq{n}", settings)
        try:
            box.start()
            box.call("bash", {"command": command}, timeout=30)
            print("unbounded")
        except SandboxDiskQuotaExceeded:
            print("quota")
        finally:
            box.stop()
    """
)

NETWORK_SCRIPT = textwrap.dedent(
    """
    import os, socket, sys
    from pathlib import Path
    from shared.config import Settings
    from workers.sandbox import SandboxSpec, create_sandbox

    base, port = Path(sys.argv[1]), int(sys.argv[2])
    settings = Settings(state_dir=base / "state", sandbox_require_isolation=True)
    spec = SandboxSpec(network=True, env={"PYTHONPATH": os.environ["PYTHONPATH"]})
    with create_sandbox(spec, base / "ws", base / "rt", settings) as box:
        command = (
            "grep -c tap0 /proc/net/route; grep -o 'tap0:' /proc/net/dev; "
            f"timeout 5 bash -c 'echo > /dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo open || echo closed; "
            f"timeout 5 bash -c 'echo > /dev/tcp/10.0.2.2/{port}' 2>/dev/null && echo open || echo closed"
        )
        print(box.call("bash", {"command": command}).output, end="")
    """
)
# slirp4netns opens /dev/net/tun as the user; a container's node may be root's only (0600). The test
# then runs in a mount namespace of its own with a world-usable node on a private tmpfs.
TUN_FOR_ALL = 'mount -t tmpfs tmpfs /dev/net && mknod -m 666 /dev/net/tun c 10 200 && exec "$@"'


@contextmanager
def reachable_by_anyone(view: Path, sources: dict[str, str]) -> Iterator[list[str]]:
    """`sources` bind-mounted read-only under `view`, so an unprivileged user reaches them even when the
    checkout sits under a private (0700) directory, as CI's clone does. Unmounted before anything is removed."""
    mounted: list[Path] = []
    try:
        for name, source in sources.items():
            target = view / name
            target.mkdir(parents=True)
            subprocess.run(["mount", "--bind", source, str(target)], check=True, capture_output=True)
            mounted.append(target)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, capture_output=True)
        yield [str(view / name) for name in sources]
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", "-l", str(target)], check=True, capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason=f"{SYSTEM_PYTHON} is not installed")
def test_sandbox_as_an_unprivileged_user(require_bwrap: None) -> None:
    base = Path(tempfile.mkdtemp(prefix="sbx-rootless-"))
    # The venv is inside the checkout (scripts/setup.sh makes it there), so one mount carries both, and
    # the sandbox binds the project (PROJECT_ROOT as the unprivileged process sees it) with its packages.
    site = Path(sysconfig.get_paths()["purelib"]).resolve().relative_to(PROJECT_ROOT)
    try:
        os.chmod(base, 0o777)
        (base / "ws").mkdir()
        os.chown(base / "ws", 65534, 65534)
        with reachable_by_anyone(base / "view", {"project": str(PROJECT_ROOT)}) as [project]:
            done = subprocess.run(
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "env",
                    "-i",
                    "PATH=/usr/bin:/bin",
                    "HOME=/tmp",
                    f"PYTHONPATH={project}/{site}:{project}",
                    SYSTEM_PYTHON,
                    "-c",
                    SCRIPT,
                    str(base),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=base,
                check=False,
            )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["65534", "/workspace", "ro", "65534", "False", "False", "quota", "quota"]
        assert os.stat(base / "ws" / "made.txt").st_uid == 65534
    finally:
        # Never remove a tree that still has the checkout mounted in it.
        if not os.path.ismount(base / "view" / "project"):
            shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason=f"{SYSTEM_PYTHON} is not installed")
@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="slirp4netns is not installed")
def test_network_sandbox_as_an_unprivileged_user(require_bwrap: None) -> None:
    """Rootless, slirp4netns must join the user namespace that owns the sandbox's network namespace."""
    base = Path(tempfile.mkdtemp(prefix="sbx-rootless-"))
    site = Path(sysconfig.get_paths()["purelib"]).resolve().relative_to(PROJECT_ROOT)
    tun_for_all = os.stat("/dev/net/tun").st_mode & 0o006 == 0o006
    prefix = [] if tun_for_all else ["unshare", "-m", "sh", "-c", TUN_FOR_ALL, "sh"]
    server = socket.create_server(("127.0.0.1", 0))
    try:
        os.chmod(base, 0o777)
        (base / "ws").mkdir()
        os.chown(base / "ws", 65534, 65534)
        with reachable_by_anyone(base / "view", {"project": str(PROJECT_ROOT)}) as [project]:
            done = subprocess.run(
                [
                    *prefix,
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "env",
                    "-i",
                    "PATH=/usr/bin:/bin:/usr/sbin:/sbin",
                    "HOME=/tmp",
                    f"PYTHONPATH={project}/{site}:{project}",
                    SYSTEM_PYTHON,
                    "-c",
                    NETWORK_SCRIPT,
                    str(base),
                    str(server.getsockname()[1]),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=base,
                check=False,
            )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["2", "tap0:", "closed", "closed"], done.stdout + done.stderr[-2000:]
    finally:
        server.close()
        if not os.path.ismount(base / "view" / "project"):
            shutil.rmtree(base, ignore_errors=True)
