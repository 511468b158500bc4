"""Sandboxes given network access: out through slirp4netns, never to the host's loopback.

Real bwrap and real slirp4netns. The host's loopback serves Redis, the API and vLLM
servers, so a real socket server on 127.0.0.1 stands in for them; a server on one of the
host's other addresses stands in for the outside (there is no internet here). No wall-clock
thresholds: connections get generous timeouts and only their outcome is checked.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shared.config import Settings
from workers.sandbox import Sandbox, SandboxError, SandboxSpec, create_sandbox
from workers.sandbox.local import bwrap_command
from workers.toolserver.reaper import descendants

GREETING = b"hello-from-host"
CONNECT = (
    "import socket\n"
    "try:\n"
    "    with socket.create_connection(({host!r}, {port}), timeout=5) as s:\n"
    "        print('got', s.recv(64).decode())\n"
    "except OSError as exc:\n"
    "    print('failed', exc)\n"
)


@contextmanager
def greeting_server(address: str) -> Iterator[int]:
    """A real TCP server on ``address`` that sends GREETING to whoever connects; yields its port."""
    server = socket.socket()
    server.bind((address, 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(GREETING)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join()


def connect_from(box: Sandbox, host: str, port: int) -> str:
    return box.call("python", {"code": CONNECT.format(host=host, port=port)}).output


def host_addresses() -> list[str]:
    """The host's global IPv4 addresses (not loopback)."""
    try:
        command = ["ip", "-4", "-o", "addr", "show", "scope", "global"]
        out = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return []
    return [line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3]


def slirp_pids(root: int) -> list[int]:
    """slirp4netns processes under ``root`` (this process's own tree only)."""
    found = []
    for pid in descendants(root):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "slirp4netns":
                found.append(pid)
        except OSError:
            continue
    return found


def gone(pid: int) -> bool:
    """Exited: no /proc entry, or a zombie left for its new parent to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` (a generous bound, not a threshold) passes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_server_on_the_hosts_loopback_is_unreachable(net_sandbox: Sandbox):
    with greeting_server("127.0.0.1") as port:
        direct = connect_from(net_sandbox, "127.0.0.1", port)
        via_gateway = connect_from(net_sandbox, "10.0.2.2", port)  # slirp's alias for the host
    assert direct.startswith("failed") and "refused" in direct, direct  # the sandbox's own loopback
    assert via_gateway.startswith("failed"), via_gateway  # --disable-host-loopback


def test_a_server_on_another_host_address_is_reachable(net_sandbox: Sandbox):
    addresses = host_addresses()
    if not addresses:
        pytest.skip("this host has only loopback addresses")
    with greeting_server(addresses[0]) as port:
        output = connect_from(net_sandbox, addresses[0], port)
    assert output.strip() == f"got {GREETING.decode()}", output


def test_the_sandbox_has_tap0_a_default_route_and_slirps_dns(net_sandbox: Sandbox):
    code = (
        "import fcntl, socket, struct\n"
        "with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:\n"
        "    packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', b'tap0'))\n"  # SIOCGIFADDR
        "print('addr', socket.inet_ntoa(packed[20:24]))\n"
        "routes = [line.split() for line in open('/proc/net/route').read().splitlines()[1:]]\n"
        "print('default', [r[0] for r in routes if r[1] == '00000000'])\n"
        "print(open('/etc/resolv.conf').read())\n"
    )
    output = net_sandbox.call("python", {"code": code}).output
    assert "addr 10.0.2.100" in output, output
    assert "default ['tap0']" in output, output
    assert "nameserver 10.0.2.3" in output and output.count("nameserver") == 1, output


def test_no_slirp4netns_outlives_the_sandbox(net_sandbox: Sandbox):
    launcher = net_sandbox._proc
    assert launcher is not None
    running = slirp_pids(launcher.pid)
    assert len(running) == 1, running
    net_sandbox.stop()
    assert not Path(f"/proc/{running[0]}").exists()
    assert slirp_pids(os.getpid()) == []


def test_slirp4netns_ends_when_its_launcher_dies(net_sandbox: Sandbox):
    """A worker killed outright takes the launcher with it: slirp4netns then sees its exit fd hang up."""
    launcher = net_sandbox._proc
    assert launcher is not None
    [slirp] = slirp_pids(launcher.pid)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    assert wait_until(lambda: gone(slirp), timeout_s=30), f"slirp4netns {slirp} outlived its launcher"


def test_exec_brings_the_network_up_first_and_takes_slirp_down(
    require_bwrap: None, require_slirp: None, workspace: Path, short_dir: Path, sandbox_settings: Settings
):
    box = create_sandbox(SandboxSpec(network=True), workspace, short_dir / "rt", sandbox_settings)
    try:
        # The command's first act reads the interface: it must already be up.
        result = box.exec("grep -c tap0 /proc/net/route; grep -o 'tap0:' /proc/net/dev", timeout=30)
        timed_out = box.exec("sleep 60", timeout=1)
    finally:
        box.stop()
    assert result.ok and result.stdout.split() == ["2", "tap0:"], result  # default route and 10.0.2.0/24
    assert timed_out.timed_out
    assert slirp_pids(os.getpid()) == []


def test_a_sandbox_without_network_starts_no_slirp(sandbox: Sandbox):
    assert sandbox._proc is not None
    assert slirp_pids(sandbox._proc.pid) == []
    output = sandbox.call("bash", {"command": "tail -n +3 /proc/net/dev | cut -d: -f1"}).output
    assert output.split() == ["lo"], output


def test_missing_slirp4netns_is_a_clear_error(
    require_bwrap: None,
    workspace: Path,
    short_dir: Path,
    sandbox_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("PATH", str(short_dir))  # nothing to find there
    box = create_sandbox(SandboxSpec(network=True), workspace, short_dir / "rt", sandbox_settings)
    with pytest.raises(SandboxError, match="package slirp4netns"):
        box.start()
    with pytest.raises(SandboxError, match="package slirp4netns"):
        box.exec("true", timeout=10)
    assert not box.running


def test_the_network_namespace_is_always_the_sandboxes_own(tmp_path: Path):
    common = dict(
        env={},
        workspace=tmp_path,
        workdir="/workspace",
        runtime_dir=tmp_path / "rt",
        uid=None,
        ro_paths=[],
        scratch_dir=tmp_path / "rt" / "tmp",
    )
    closed = bwrap_command(["true"], network=False, **common)
    opened = bwrap_command(["true"], network=True, resolv_conf=tmp_path / "resolv.conf", **common)
    assert "--unshare-net" in closed and "--unshare-net" in opened
    assert "--info-fd" not in closed and "--block-fd" not in closed
    assert "--info-fd" in opened and "--block-fd" in opened
    assert str(tmp_path / "resolv.conf") in opened
    with pytest.raises(ValueError):
        bwrap_command(["true"], network=True, **common)
