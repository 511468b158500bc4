"""Which worker process owns a sandbox's host directories, so that a dead worker's can be found and removed.

A worker SIGKILLed (the OOM killer, a node agent, a test) runs no teardown: its sandboxes' processes die
with it (bwrap's ``--die-with-parent`` and the launcher's parent-death signal, host_processes.py), but the
directories it made for them stay: each sandbox's node-local runtime dir (its /tmp, socket, tool-server
state) and each ready sandbox's pool directory under the workspaces. So every such name carries its
owner, ``<pid>.<start>`` (the process's start time in clock ticks since boot, from /proc): a pid alone
may be reused by a new worker, whose directories must never be touched; a pid with its start time names
one process, ever, on this node. ``sweep`` removes what dead owners left; a worker runs it when it
starts (workers/runtime/main.py), a sandbox pool when it is built and once a minute after (pool.py).

Names (the sandbox id is what the job's record names, ``sandboxes`` in GET /v1/jobs/{id}):

* sandbox id: ``<host>-<pid>.<start>-<random>``; its runtime dir: ``<tmp>/ro-<pid>.<start>-<random>``;
  a ready sandbox's pool directory: ``<workspaces>/.pool/<sandbox id>``;
* the process's compiled seccomp filter and network resolv.conf: ``<tmp>/ro-<pid>.<start>-<what>-<random>``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from workers.toolserver.reaper import start_ticks

log = logging.getLogger("rollouts.sandbox.owner")

RUNTIME_PREFIX = "ro-"
POOL_DIR = ".pool"  # under the workspaces root: the pools' own directories (pool.py)
_TAG = r"(?P<pid>\d+)\.(?P<start>\d+)"
_RUNTIME = re.compile(rf"^{RUNTIME_PREFIX}{_TAG}-.")  # runtime dirs, and the seccomp filter's and resolv.conf's
_LEGACY_HOME = re.compile(r"^(?P<pid>\d+)-[0-9a-f]+$")  # <host>-<pid>-<id>, before start times
_HOME = re.compile(rf"^{_TAG}-[0-9a-f]+$")

_own: tuple[int, str] | None = None


def owner_tag() -> str:
    """This process's ``<pid>.<start>`` (recomputed in a forked child, which is another owner)."""
    global _own
    pid = os.getpid()
    if _own is None or _own[0] != pid:
        _own = (pid, f"{pid}.{start_ticks(pid) or 0}")
    return _own[1]


def alive(pid: int, start: int | None) -> bool:
    """Whether the process that made a directory still runs: same pid and, when named, same start time."""
    now = start_ticks(pid)
    return now is not None and (start is None or now == start)


def owned_prefix(what: str) -> str:
    """A ``mkdtemp`` prefix for a node-local directory of this process that ``sweep`` removes once it is dead."""
    return f"{RUNTIME_PREFIX}{owner_tag()}-{what}-"


def new_sandbox_id() -> str:
    """A fresh sandbox id of this process: ``<host>-<pid>.<start>-<random>``."""
    return f"{socket.gethostname()}-{owner_tag()}-{uuid.uuid4().hex[:8]}"


def runtime_dir_for(sandbox_id: str) -> Path:
    """The node-local runtime dir of a sandbox of this node, named by its id without the host (short: the
    tool server's Unix socket lives in it)."""
    return Path(tempfile.gettempdir()) / (RUNTIME_PREFIX + sandbox_id.removeprefix(f"{socket.gethostname()}-"))


def sandbox_id_of(runtime_dir: Path) -> str:
    """The id of the sandbox whose runtime dir this is (the inverse of ``runtime_dir_for`` on this host)."""
    return f"{socket.gethostname()}-{runtime_dir.name.removeprefix(RUNTIME_PREFIX)}"


@dataclass
class Swept:
    """What a sweep removed, for its log line and the tests."""

    runtime_dirs: list[Path]
    pool_homes: list[Path]

    def __bool__(self) -> bool:
        return bool(self.runtime_dirs or self.pool_homes)


def sweep(pool_root: Path | None, tmp: Path | None = None) -> Swept:
    """Remove the runtime dirs (node-local) and pool directories (this host's, under ``pool_root``) whose
    owner is no longer running. A live owner's, another host's and names not ours are left alone."""
    swept = Swept(_sweep_runtime_dirs(tmp or Path(tempfile.gettempdir())), _sweep_pool_homes(pool_root))
    if swept:
        log.info(
            "removed what dead workers left: %d sandbox runtime dir(s), %d pool directory(ies)",
            len(swept.runtime_dirs),
            len(swept.pool_homes),
        )
    return swept


def _sweep_runtime_dirs(tmp: Path) -> list[Path]:
    removed = []
    for entry in _entries(tmp):
        match = _RUNTIME.match(entry.name)
        if match and entry.is_dir(follow_symlinks=False) and not _owner_alive(match):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _sweep_pool_homes(root: Path | None) -> list[Path]:
    prefix = f"{socket.gethostname()}-"
    removed = []
    for entry in _entries(root) if root is not None else []:
        if not entry.name.startswith(prefix):
            continue  # another node's: only that node can tell whether its owner lives
        rest = entry.name[len(prefix) :]
        match = _HOME.match(rest) or _LEGACY_HOME.match(rest)
        if match and not _owner_alive(match):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _owner_alive(match: re.Match[str]) -> bool:
    start = match.groupdict().get("start")
    return alive(int(match["pid"]), int(start) if start is not None else None)


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(directory))
    except OSError:
        return []
