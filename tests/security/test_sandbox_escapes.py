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
        "find / -name host-secret.txt -not -path '/proc/*' 2>/dev/null",
    ]
    for command in attempts:
        assert "s3cr3t-host-data" not in bash(sandbox, command), command
    assert bash(sandbox, "cat /workspace/mine.txt") == "agent data\n"


@pytest.mark.parametrize("box", ["sandbox", "net_sandbox"])
def test_a_server_on_the_hosts_loopback_is_unreachable(box: str, request: pytest.FixtureRequest):
    """Also for a task given network access: 10.0.2.2 is slirp4netns' alias for the host."""
    sandbox: Sandbox = request.getfixturevalue(box)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "for host in ('127.0.0.1', 'localhost', '10.0.2.2'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=3); print('connected')\n"
            "    except OSError as exc:\n"
            "        print('refused', exc.errno)\n"
        )
        output = sandbox.call("python", {"code": code}).output
    assert "connected" not in output and output.count("refused") == 3


def test_names_do_not_resolve_and_no_outside_address_is_reachable(sandbox: Sandbox):
    output = bash(
        sandbox,
        "getent hosts pypi.org || echo no-dns; timeout 5 bash -c 'echo > /dev/tcp/1.1.1.1/53' 2>&1 || echo no-route",
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


# Each prints "refused" when the kernel says no; a working call prints what it got.
_KERNEL_ATTEMPTS = {
    "new user namespace (unshare -U)": "unshare -U -r true 2>/dev/null && echo allowed || echo refused",
    "new mount namespace": "unshare -m true 2>/dev/null && echo allowed || echo refused",
    "ptrace a sibling": (
        "sleep 30 & python3 - $! <<'PY' 2>/dev/null || python - $! <<'PY'\n"
        "import ctypes, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('refused' if libc.ptrace(16, int(sys.argv[1]), 0, 0) != 0 else 'allowed')\n"
        "PY\n"
    ),
}
_SYSCALLS = {  # x86-64 numbers: keyctl, bpf, perf_event_open, userfaultfd, io_uring_setup, clone(CLONE_NEWUSER)
    "keyctl": "libc.syscall(250, 0, 0, 0, 0, 0)",
    "bpf": "libc.syscall(321, 0, 0, 0)",
    "perf_event_open": "libc.syscall(298, 0, 0, -1, -1, 0)",
    "userfaultfd": "libc.syscall(323, 0)",
    "io_uring_setup": "libc.syscall(425, 1, 0)",
    "clone(CLONE_NEWUSER)": "libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)",
}


@pytest.mark.parametrize("attempt", sorted(_KERNEL_ATTEMPTS))
def test_namespaces_and_ptrace_are_refused_inside(sandbox: Sandbox, attempt: str):
    assert bash(sandbox, _KERNEL_ATTEMPTS[attempt]).strip().splitlines()[-1] == "refused"


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers are x86-64's")
@pytest.mark.parametrize("name", sorted(_SYSCALLS))
def test_kernel_interfaces_escapes_use_are_refused_with_eperm(sandbox: Sandbox, name: str):
    code = (
        "import ctypes, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"result = {_SYSCALLS[name]}\n"
        "print(result, errno.errorcode.get(ctypes.get_errno()))\n"
    )
    output = sandbox.call("python", {"code": code}).output
    assert "-1 EPERM" in output, output


def test_ordinary_work_still_runs_under_the_filter(sandbox: Sandbox):
    output = bash(
        sandbox,
        'python3 -c \'import subprocess, threading; print(subprocess.run(["echo", "ok"], '
        "capture_output=True, text=True).stdout.strip())' 2>&1 || "
        'python -c \'import subprocess; print(subprocess.run(["echo", "ok"], '
        "capture_output=True, text=True).stdout.strip())'; (sleep 0.1 & wait) && echo jobs-ok",
    )
    assert output.split() == ["ok", "jobs-ok"], output
