"""The seccomp filter every bubblewrap sandbox runs under: the kernel calls an agent has no use for.

Namespaces and dropped capabilities already keep a sandbox from the host; this filter removes the
kernel surface that escapes and privilege escalations go through, as container runtimes and
flatpak do: new user namespaces (`unshare -U`, `clone(CLONE_NEWUSER)`), mounts, ptrace and
reading other processes' memory, the kernel keyring, eBPF, perf events, userfaultfd, io_uring,
module loading and kexec, terminal input injection (TIOCSTI), and the like. Each is refused with
EPERM (a program sees an ordinary "Operation not permitted"); clone3 gets ENOSYS so that libc falls
back to clone, whose flags the filter can read.

The filter is compiled once per process with libseccomp (through pyseccomp's ctypes binding) into
a BPF file; bwrap loads it from a file descriptor (`--seccomp`) just before it starts the
sandbox's first process, which cannot remove it.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pyseccomp as seccomp

from workers.sandbox.owner import owned_prefix

# The flags of clone(2) and unshare(2) that create namespaces.
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET)
TIOCSTI = 0x5412

REFUSED = (
    # namespaces and mounts
    "unshare",
    "setns",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    # other processes and the kernel
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "quotactl",
    "quotactl_fd",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "vhangup",
    "nfsservctl",
    "uselib",
    "personality",
)


def _build(path: Path) -> None:
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    refuse = seccomp.ERRNO(errno.EPERM)
    for name in REFUSED:
        with contextlib.suppress(ValueError, RuntimeError, OSError):  # not a syscall on this architecture
            rules.add_rule(refuse, name)
    for flag in NAMESPACE_FLAGS:
        rules.add_rule(refuse, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(refuse, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags sit in memory a filter cannot read
    with path.open("wb") as handle:
        rules.export_bpf(handle)


_FILTER_LOCK = threading.Lock()


def filter_path() -> Path:
    """The compiled filter (a file of BPF instructions), built once per process in a private directory
    that goes with it. Only the launching shell, which runs as the worker, opens it."""
    with _FILTER_LOCK:  # one per process, not one per thread that asked first at once
        return _filter_path(os.getpid())  # per process: a forked child builds its own, named after it


@functools.cache
def _filter_path(pid: int) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=owned_prefix("seccomp")))  # swept if the worker is killed
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = directory / "filter.bpf"
    _build(path)
    return path


def with_filter(bwrap_argv: list[str], fd: int = 9) -> list[str]:
    """`bwrap_argv` (which names `--seccomp fd`) started with the filter open on `fd`.

    A one-line shell opens the file and execs bwrap, so no caller needs to pass descriptors along."""
    return ["/bin/sh", "-c", f'exec "$@" {fd}< "$0"', str(filter_path()), *bwrap_argv]
