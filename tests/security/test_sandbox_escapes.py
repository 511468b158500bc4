"""An agent trying to get out of its sandbox: read the host, reach the network, write the image,
kill processes outside. Every attempt runs as the agent would run it (the bash and python tools)
and must fail, while the same action on the sandbox's own files succeeds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from workers.sandbox import Sandbox, SandboxError

pytestmark = pytest.mark.usefixtures("require_bwrap")

PROJECT = Path(__file__).resolve().parents[2]


def bash(box: Sandbox, command: str) -> str:
    return box.call("bash", {"command": command}).output


def test_host_files_next_to_the_workspace_are_invisible(sandbox: Sandbox, workspace: Path, short_dir: Path):
    secret = short_dir / "host-secret.txt"
    secret.write_text("s3cr3t-host-data\n")
    (workspace / "mine.txt").write_text("agent data\n")
    attempts = [
        f"cat {secret}",
        f"cat {workspace}/../host-secret.txt",
        "cat /workspace/../host-secret.txt",
        f"cat /proc/1/root{secret}",
        "cat /root/.bash_history /root/.ssh/id_rsa /etc/shadow",
        f"find / -name host-secret.txt -not -path '/proc/*' 2>/dev/null",
    ]
    for command in attempts:
        assert "s3cr3t-host-data" not in bash(sandbox, command), command
    assert bash(sandbox, "cat /workspace/mine.txt") == "agent data\n"


def test_a_server_on_the_hosts_loopback_is_unreachable(sandbox: Sandbox):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "for host in ('127.0.0.1', 'localhost'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=3); print('connected')\n"
            "    except OSError as exc:\n"
            "        print('refused', exc.errno)\n"
        )
        output = sandbox.call("python", {"code": code}).output
    assert "connected" not in output and output.count("refused") == 2


def test_names_do_not_resolve_and_no_outside_address_is_reachable(sandbox: Sandbox):
    output = bash(
        sandbox,
        "getent hosts pypi.org || echo no-dns; "
        "timeout 5 bash -c 'echo > /dev/tcp/1.1.1.1/53' 2>&1 || echo no-route",
    )
    assert "no-dns" in output and "no-route" in output


@pytest.mark.parametrize(
    "target",
    ["/usr/bin/escape", "/etc/escape", "/opt/escape", f"{PROJECT}/escape", f"{Path(sys.prefix)}/escape"],
)
def test_the_image_and_the_bound_code_are_read_only(sandbox: Sandbox, target: str):
    output = bash(sandbox, f"echo x > {target} 2>&1; ls {target} 2>&1")
    assert "Read-only file system" in output or "No such file" in output.splitlines()[0]
    assert not Path(target).exists()


def test_remounting_the_system_writable_is_refused(sandbox: Sandbox):
    output = bash(sandbox, "mount -o remount,rw /usr 2>&1; touch /usr/escape 2>&1")
    assert "Read-only file system" in output
    assert not Path("/usr/escape").exists()


def test_processes_outside_the_sandbox_cannot_be_signalled(sandbox: Sandbox):
    bystander = subprocess.Popen(["sleep", "120"])
    try:
        output = bash(sandbox, f"kill -9 {bystander.pid} 2>&1; kill -9 {os.getpid()} 2>&1; ls /proc | grep -c '^[0-9]'")
        assert output.count("No such process") == 2
        assert int(output.splitlines()[-1]) < 20, "the sandbox sees the host's processes"
        # Signal everything it can see: that ends the sandbox itself (its tool server), nothing else.
        with pytest.raises(SandboxError):
            bash(sandbox, "kill -9 -1")
        assert bystander.poll() is None, "a host process was killed from inside the sandbox"
    finally:
        bystander.kill()
        bystander.wait()
