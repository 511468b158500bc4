"""What a bubblewrap sandbox given network access needs besides bwrap's own flags.

Its command runs under ``slirp_launcher`` (slirp4netns on the sandbox's own network
namespace), and it reads a resolv.conf naming slirp's DNS: the host's may name a resolver on
the host's loopback, which the sandbox cannot reach. Both are refused loudly rather than
skipped, since the only fallback would be the host's network, loopback and all.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from workers.sandbox import slirp_launcher
from workers.sandbox.owner import owned_prefix
from workers.sandbox.sandbox import SandboxError

RESOLV_CONF = "/etc/resolv.conf"
SLIRP_PACKAGE = "slirp4netns"  # Debian's and Ubuntu's name; the binary's too


def network_launcher(bwrap_argv: list[str], *, userns: bool) -> list[str]:
    """``bwrap_argv`` run under slirp_launcher; a SandboxError naming the package if slirp4netns is missing.

    ``userns``: bwrap makes a user namespace (rootless), which slirp4netns must join."""
    if shutil.which("slirp4netns") is None:
        raise SandboxError(
            "the task asks for network access, which needs slirp4netns, and it is not installed "
            f"(Debian/Ubuntu package {SLIRP_PACKAGE}: apt-get install {SLIRP_PACKAGE})"
        )
    flags = [slirp_launcher.USERNS_FLAG] if userns else []
    return [sys.executable, "-I", "-S", slirp_launcher.__file__, *flags, "--", *bwrap_argv]


def resolv_conf_target() -> str | None:
    """Where the sandbox reads its resolver from: the file /etc/resolv.conf leads to on the host (a
    systemd host links it into /run, which the sandbox lacks; bwrap creates it there). None where the
    host has no /etc/resolv.conf: bwrap could not create one in the read-only /etc."""
    if not os.path.lexists(RESOLV_CONF):
        return None
    return os.path.realpath(RESOLV_CONF)


_RESOLV_LOCK = threading.Lock()


def slirp_resolv_conf() -> Path:
    """A resolv.conf naming slirp's DNS, written once per process in a private directory (only bwrap,
    as the worker, reads it there; the sandbox sees it read-only at ``resolv_conf_target()``)."""
    with _RESOLV_LOCK:  # one per process, not one per thread that asked first at once
        return _slirp_resolv_conf(os.getpid())  # per process: a forked child builds its own, named after it


@functools.cache
def _slirp_resolv_conf(pid: int) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=owned_prefix("resolv")))  # swept if the worker is killed
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = directory / "resolv.conf"
    path.write_text(f"nameserver {slirp_launcher.DNS}\n")
    path.chmod(0o644)
    return path
