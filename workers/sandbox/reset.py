"""Reset a used sandbox for the next job, and prove it clean from outside; unproven means discarded.

The tool server does the inside half (workers/toolserver/reset.py: shell and kernel stopped,
every other process but the kernel fork server killed once, /tmp and its state emptied). Then
the worker, which the sandbox cannot lie to, checks what the kernel and the host's filesystem
say: no process left in the sandbox but the tool server, its launchers and the kernel fork
server the last warm-up found (the same process by host pid and start time, with the same limits
and priority, not stopped; nothing under it), /tmp empty, nothing in the runtime directory but
the server's socket, log, /tmp and (empty) state directory, and the quota never hit. The
workspace is handed back empty by workers/sandbox/handoff.py. Only then are a fresh shell (the
sandbox's start environment and working directory) and, where wanted, a fresh kernel started.
Any ``str`` returned is why the sandbox must be stopped instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from workers.sandbox.sandbox import SCRATCH_NAME, SOCKET_NAME, Sandbox, SandboxError
from workers.toolserver.kernel_forks import FORK_SERVER_NAME
from workers.toolserver.reaper import children, descendants, kept_state

_RUNTIME_ENTRIES = frozenset({SOCKET_NAME, SCRATCH_NAME, "toolserver", "toolserver.log"})
_RESET_TIMEOUT_S = 60.0


def _inner_pid(pid: int) -> int | None:
    """The pid a process has in its own (innermost) pid namespace, when it is in a nested one."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    fields = line.split()[1:]
                    return int(fields[-1]) if len(fields) > 1 else None
    except OSError:
        return None
    return None


def server_host_pid(sandbox: Sandbox, server_pid: int) -> int | None:
    """The host's pid of the tool server, which says ``server_pid`` inside its pid namespace."""
    launcher = sandbox.launcher_pid
    if launcher is None:
        return None
    return next((pid for pid in descendants(launcher) if _inner_pid(pid) == server_pid), None)


def tmpfs_fingerprint(host_pid: int) -> frozenset[tuple[str, int, int]]:
    """(path, mode, size) of every entry of the sandbox's own in-memory trees, its ``/`` and ``/dev``
    (bwrap makes both, mount points aside), seen from outside through ``/proc/<pid>/root``. As root the
    sandbox's uid cannot write there; rootless it owns them, so a file left there (``/dev/shm/x``) would
    outlive a reset that only empties /workspace and /tmp: the fingerprint taken clean must match."""
    root = f"/proc/{host_pid}/root"
    found: set[tuple[str, int, int]] = set()
    for top in (root, os.path.join(root, "dev")):
        device = os.lstat(top).st_dev
        for dirpath, dirnames, filenames in os.walk(top):
            inside = []
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if st.st_dev != device:
                    continue  # a mount point: another tree, checked (or read-only) on its own
                found.add((os.path.relpath(path, root), st.st_mode, st.st_size))
                if name in dirnames:
                    inside.append(name)
            dirnames[:] = inside
    return frozenset(found)


def take_fingerprint(sandbox: Sandbox) -> None:
    """Record what the sandbox's own in-memory trees hold while it is known clean (started, no job yet)."""
    try:
        server_pid = sandbox.control({"op": "ping"}, 5.0).get("pid")
        host_pid = server_host_pid(sandbox, server_pid) if isinstance(server_pid, int) else None
        sandbox.clean_fingerprint = tmpfs_fingerprint(host_pid) if host_pid is not None else None
    except (SandboxError, OSError):
        sandbox.clean_fingerprint = None  # its reset then cannot be proven: it is discarded


def leftover_processes(sandbox: Sandbox, server_pid: int) -> list[int]:
    """Processes of the sandbox (live or not yet reaped), as the host sees them, other than the tool server
    (``server_pid`` inside), the processes that launched it, and the kernel fork server the last warm-up
    found (the same process, by host pid and start, still the server's child, not stopped)."""
    launcher = sandbox.launcher_pid
    if launcher is None:
        return []
    tree = descendants(launcher)
    server = next((pid for pid in tree if _inner_pid(pid) == server_pid), None)
    if server is None:
        return tree  # no tool server found: nothing is proven
    keep = {server}
    parents = {pid: _parent(pid) for pid in tree}
    up = parents.get(server)
    while up is not None and up in parents:
        keep.add(up)
        up = parents[up]
    if sandbox.clean_fork_server is not None and _fork_server_of(server) == sandbox.clean_fork_server:
        keep.add(sandbox.clean_fork_server[0])
    return [pid for pid in tree if pid not in keep]  # a zombie too: the next job's `ps` would list it


def _fork_server_of(server: int) -> tuple[int, int, str, str] | None:
    """The tool server's kernel fork server (its child of that name) as (host pid, start ticks, limits,
    nice): what names it and what a job could have changed of it; None when there is none, or it is stopped."""
    for pid in children(server):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        state = kept_state(pid) if name == FORK_SERVER_NAME else None
        if state is not None:
            return (pid, *state)
    return None


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _bind_skeleton(sandbox: Sandbox) -> frozenset[Path]:
    """The directories bwrap made in the sandbox's /tmp to bind host paths at their own paths (the runtime
    dir, Python, the project: under /tmp where the node's temp dir is /tmp or a checkout lives there, a CI
    clone), relative to /tmp: every prefix of each such path."""
    skeleton: set[Path] = set()
    for path in sandbox.host_binds:
        try:
            inside = path.relative_to(sandbox.scratch_inside)
        except ValueError:
            continue
        skeleton.update(Path(*inside.parts[: n + 1]) for n in range(len(inside.parts)))
    return frozenset(skeleton)


def scratch_mount_points(sandbox: Sandbox) -> frozenset[str]:
    """Names in the sandbox's /tmp that lead to mount points, not the last job's files."""
    return frozenset(path.parts[0] for path in _bind_skeleton(sandbox))


def _only_skeleton(top: Path, name: str, skeleton: frozenset[Path]) -> bool:
    """Whether the host's view of /tmp/<name> holds nothing but the directories bwrap made for binds."""
    for root, dirs, files in os.walk(top / name):
        relative = Path(name) / Path(root).relative_to(top / name)
        if files or relative not in skeleton or any(relative / d not in skeleton for d in dirs):
            return False
    return True


def _runtime_leftovers(sandbox: Sandbox) -> list[str]:
    found = []
    for entry in os.scandir(sandbox.runtime_dir):
        if entry.name not in _RUNTIME_ENTRIES:
            found.append(entry.name)
    skeleton = _bind_skeleton(sandbox)
    for entry in os.scandir(sandbox.scratch_dir):
        if not entry.is_dir(follow_symlinks=False) or not _only_skeleton(sandbox.scratch_dir, entry.name, skeleton):
            found.append(f"/tmp/{entry.name}")
    state = sandbox.runtime_dir / "toolserver"
    if state.exists():
        found += [f"toolserver/{entry.name}" for entry in os.scandir(state)]
    return found


def reset_processes(sandbox: Sandbox) -> str | None:
    """The reset's first half: nothing of the last job runs any more, /tmp and the state are empty."""
    if not sandbox.running:
        return "the sandbox is not running"
    if sandbox.over_quota is not None:
        return f"the sandbox hit its disk quota: {sandbox.over_quota}"
    try:
        server_pid = sandbox.control({"op": "ping"}, 5.0).get("pid")
        keep = sorted(scratch_mount_points(sandbox))
        reply = sandbox.control({"op": "reset", "scratch": sandbox.scratch_inside, "keep": keep}, _RESET_TIMEOUT_S)
    except SandboxError as exc:
        return str(exc)
    if not reply.get("clean"):
        return "the tool server could not reset: " + "; ".join(map(str, reply.get("problems") or ["(no reason)"]))
    if not isinstance(server_pid, int):
        return "the tool server did not say its pid"
    left = leftover_processes(sandbox, server_pid)
    if left:
        return f"{len(left)} processes still run in the sandbox after its reset"
    why = _tmpfs_changed(sandbox, server_pid)
    if why is not None:
        return why
    try:
        leftovers = _runtime_leftovers(sandbox)
    except OSError as exc:
        return f"cannot read the sandbox's runtime dir: {exc}"
    if leftovers:
        return f"left in the sandbox's runtime dir after its reset: {', '.join(sorted(leftovers)[:5])}"
    if sandbox.over_quota is not None:
        return f"the sandbox hit its disk quota: {sandbox.over_quota}"
    return None


def _tmpfs_changed(sandbox: Sandbox, server_pid: int) -> str | None:
    if sandbox.clean_fingerprint is None:
        return "no fingerprint of the sandbox taken clean"
    host_pid = server_host_pid(sandbox, server_pid)
    try:
        now = tmpfs_fingerprint(host_pid) if host_pid is not None else None
    except OSError as exc:
        return f"cannot read the sandbox's / and /dev: {exc}"
    if now != sandbox.clean_fingerprint:
        changed = sorted({entry[0] for entry in now ^ sandbox.clean_fingerprint}) if now is not None else []
        return f"changed outside /workspace and /tmp: {', '.join(changed[:5]) or 'the tool server is gone'}"
    return None


def warm(sandbox: Sandbox, python: bool, timeout: float) -> str | None:
    """Start the shell (and the kernel) ahead of the next job; why not, or None."""
    try:
        sandbox.control({"op": "warm", "python": python}, timeout)
        server_pid = sandbox.control({"op": "ping"}, 5.0).get("pid")
    except SandboxError as exc:
        return str(exc)
    server = server_host_pid(sandbox, server_pid) if isinstance(server_pid, int) else None
    sandbox.clean_fork_server = _fork_server_of(server) if server is not None else None  # no job has run yet
    log = sandbox.runtime_dir / "toolserver.log"
    try:  # the last job's process wrote it (rootless: as its own user): nothing of it is passed on
        with open(log, "r+b") as handle:
            handle.truncate(0)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"cannot empty {Path(log).name}: {exc}"
    return None
