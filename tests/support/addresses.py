"""This machine's addresses as a cluster neighbour sees them."""

from __future__ import annotations

import socket
import subprocess

import pytest


def node_address() -> str:
    """The first non-loopback IPv4 address (where a neighbour would connect); skips the test without one."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout.split()
    address = next((a for a in out if "." in a and not a.startswith("127.")), None)
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    return address


def refuses(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is refused (nothing listens there for that address)."""
    with socket.socket() as probe:
        probe.settimeout(5)
        return probe.connect_ex((host, port)) != 0
