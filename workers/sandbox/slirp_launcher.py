"""Start a bwrap sandbox whose network namespace reaches out only through slirp4netns.

A sandbox given network access still gets a namespace of its own (``--unshare-net``):
sharing the host's would let it reach every service on the host's loopback (Redis, the
API, vLLM servers with no auth). slirp4netns gives that namespace a ``tap0`` with
user-mode NAT to the outside and, with ``--disable-host-loopback``, no way to the
host's 127.0.0.0/8 (not even through its gateway alias 10.0.2.2).

slirp4netns can only attach once the namespace exists, and the sandbox's command must
not run before the interface is up, so this script sits between the worker and bwrap:

1. starts bwrap, which reports its child's pid on ``INFO_FD`` and then waits on
   ``BLOCK_FD`` before running the command;
2. waits until that child has brought its loopback up, then starts slirp4netns on
   it and waits for its ready fd (slirp4netns brings ``lo`` up too, and the kernel
   then gives it 127.0.0.1: had it come first, bwrap's own RTM_NEWADDR would fail
   with EEXIST and the sandbox with it);
3. releases bwrap, waits for it, then stops slirp4netns and returns bwrap's status.

slirp4netns is this process's child, in the sandbox's session: ``Sandbox.stop`` kills it
with the rest of the launcher's tree; its ``--exit-fd`` also ends it if this process dies
(which a parent-death signal ties to the worker's spawner thread, as bwrap's
``--die-with-parent`` did before). Run by path with ``python -I -S``: standard library only,
so starting it costs an interpreter, not the project's imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO

INFO_FD = 10  # bwrap --info-fd: JSON with "child-pid"
BLOCK_FD = 11  # bwrap --block-fd: the command waits until a byte arrives here
MTU = 65520
DNS = "10.0.2.3"  # slirp's own resolver, forwarding to the host's
USERNS_FLAG = "--userns"
PR_SET_PDEATHSIG = 1
NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: the user namespace that owns it
LOOPBACK_UP = "127.255.255.255"  # lo's broadcast route: in the fib only once lo is up


def slirp_command(pid: int, ready_fd: int, exit_fd: int, userns_fd: int | None) -> list[str]:
    """The slirp4netns argv for the sandbox whose init is ``pid``.

    Rootless (``userns_fd`` set) it joins the user namespace that owns the sandbox's
    network namespace: ``/proc/<pid>/ns/user`` may already be the inner one bwrap makes
    for ``--disable-userns``, in which slirp4netns has no right to the network namespace.
    As root it may sandbox itself (own mount namespace, capabilities dropped); in a
    bwrap user namespace, which maps no gid 0, that step fails, so only seccomp is used.
    """
    cmd = ["slirp4netns", "--configure", f"--mtu={MTU}", "--disable-host-loopback"]
    cmd += ["--ready-fd", str(ready_fd), "--exit-fd", str(exit_fd), "--enable-seccomp"]
    if userns_fd is None:
        cmd.append("--enable-sandbox")
    else:
        cmd.append(f"--userns-path=/proc/self/fd/{userns_fd}")
    return [*cmd, str(pid), "tap0"]


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent was already gone
        os._exit(1)


def _read_child_pid(fd: int) -> int | None:
    """bwrap's child pid from its info fd; None if bwrap closed it without one (it failed)."""
    data, decoder = "", json.JSONDecoder()
    while chunk := os.read(fd, 4096):
        data += chunk.decode()
        try:
            return int(decoder.raw_decode(data.lstrip())[0]["child-pid"])
        except (ValueError, KeyError):
            continue
    return None


def _wait_for_loopback(pid: int, bwrap: subprocess.Popen[bytes]) -> bool:
    """Wait until bwrap's child has set up its loopback; False if bwrap or the child ended first.

    Polled: bwrap says nothing between reporting the pid and blocking on BLOCK_FD."""
    delay = 0.0005
    while bwrap.poll() is None:
        try:
            with open(f"/proc/{pid}/net/fib_trie") as fib:
                if LOOPBACK_UP in fib.read():
                    return True
        except OSError:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    return False


def _owning_userns(pid: int) -> int:
    """An fd of the user namespace that owns ``pid``'s network namespace."""
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(net, NS_GET_USERNS)
    finally:
        os.close(net)


def _start_bwrap(argv: list[str]) -> tuple[subprocess.Popen[bytes], int, int]:
    """bwrap with the info and block pipes on their fixed fds; (process, info read end, block write end).

    bwrap inherits what this process was given (the seccomp filter's fd) and the two pipe
    ends; Python's own descriptors are close-on-exec."""
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    os.dup2(info_w, INFO_FD)
    os.dup2(block_r, BLOCK_FD)
    try:
        proc = subprocess.Popen(argv, close_fds=False)
    finally:
        for fd in (INFO_FD, BLOCK_FD, info_w, block_r):
            os.close(fd)
    return proc, info_r, block_w


def _start_slirp(pid: int, rootless: bool, log: IO[bytes]) -> tuple[subprocess.Popen[bytes], int, bool]:
    """slirp4netns attached to ``pid``; (process, its exit fd's write end, whether it came up)."""
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    userns = _owning_userns(pid) if rootless else None
    passed = (ready_w, exit_r) if userns is None else (ready_w, exit_r, userns)
    try:
        proc = subprocess.Popen(
            slirp_command(pid, ready_w, exit_r, userns),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=passed,
        )
    finally:
        for fd in passed:
            os.close(fd)
    try:
        ready = os.read(ready_r, 1) == b"1"  # EOF: it exited before the interface was up
    finally:
        os.close(ready_r)
    return proc, exit_w, ready


def _status(code: int) -> int:
    return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    """``[--userns] -- bwrap ...``: run bwrap (which names INFO_FD and BLOCK_FD) with slirp4netns."""
    _die_with_parent()
    rootless = argv[0] == USERNS_FLAG
    bwrap_argv = argv[argv.index("--") + 1 :]
    bwrap, info_r, block_w = _start_bwrap(bwrap_argv)
    pid = _read_child_pid(info_r)
    os.close(info_r)
    if pid is None:  # bwrap failed before its child existed
        os.close(block_w)
        return _status(bwrap.wait())
    if not _wait_for_loopback(pid, bwrap):
        if bwrap.poll() is None:  # never release a sandbox whose network cannot come up
            bwrap.kill()
            print(f"sandbox network: cannot watch /proc/{pid}/net/fib_trie for the loopback", file=sys.stderr)
        os.close(block_w)
        code = _status(bwrap.wait())
        return code or 1
    with tempfile.TemporaryFile() as log:
        slirp, exit_w, ready = _start_slirp(pid, rootless, log)
        try:
            if not ready:
                bwrap.kill()  # its child (the sandbox's init) dies with it
                bwrap.wait()
                log.seek(0)
                detail = log.read().decode(errors="replace").strip()
                print(f"sandbox network: slirp4netns failed (exit {slirp.wait()}): {detail}", file=sys.stderr)
                return 1
            with contextlib.suppress(BrokenPipeError):  # the child is already gone: bwrap's status says why
                os.write(block_w, b"1")
            return _status(bwrap.wait())
        finally:
            os.close(block_w)
            os.close(exit_w)  # slirp4netns ends on its exit fd's hang-up
            try:
                slirp.wait(5.0)
            except subprocess.TimeoutExpired:
                slirp.kill()
                slirp.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
