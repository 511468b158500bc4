"""Local backend: a process sandbox over the job's workspace, isolated with bubblewrap.

bwrap gives the sandbox new pid, ipc, uts, cgroup and network namespaces, a
read-only view of the system (/usr, /etc, the Python environment and the
project), a private /tmp on disk in the runtime dir, and the workspace: the
only writable host directories, both inside the sandbox's disk quota. With its own pid namespace, killing the
sandbox's bwrap takes every process inside with it. Where bwrap cannot create
namespaces, a plain process in its own session with the same rlimits is the
fallback, with a warning (or an error with ``sandbox_require_isolation``).
A task given network access keeps its own network namespace and reaches out
through slirp4netns (``network.py``, ``slirp_launcher.py``), never through
the host's namespace, whose loopback serves Redis, the API and vLLM.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

from shared.config import Settings
from workers.sandbox import slirp_launcher
from workers.sandbox.isolation import UidSlot, chown_tree
from workers.sandbox.network import network_launcher, resolv_conf_target, slirp_resolv_conf
from workers.sandbox.sandbox import Sandbox, SandboxError
from workers.sandbox.seccomp import with_filter
from workers.sandbox.spec import SandboxSpec

log = logging.getLogger("rollouts.sandbox.local")

PROJECT_ROOT = Path(__file__).resolve().parents[2]
_SYSTEM_RO = ("/usr", "/etc", "/opt")
_MERGED_USR = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SECCOMP_FD = 9


@functools.lru_cache(maxsize=1)
def bwrap_usable() -> tuple[bool, str]:
    """Whether bwrap can create the namespaces we need here, under the seccomp filter, and why not."""
    probe = ["bwrap", "--unshare-pid", "--unshare-net", "--seccomp", str(SECCOMP_FD), "--ro-bind", "/", "/", "true"]
    if os.geteuid() != 0:
        probe[1:1] = ["--unshare-user", "--disable-userns"]
    try:
        probe = with_filter(probe, SECCOMP_FD)
    except (OSError, RuntimeError, ValueError) as exc:  # libseccomp missing or refusing the rules
        return False, f"cannot build the seccomp filter: {exc}"
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=20, check=False)
    except FileNotFoundError:
        return False, "bwrap is not installed (Debian package bubblewrap)"
    except subprocess.TimeoutExpired:
        return False, "bwrap probe timed out"
    if done.returncode != 0:
        return False, f"bwrap cannot create namespaces here: {done.stderr.strip()}"
    return True, ""


def readonly_paths() -> list[str]:
    """Host paths the tool server needs besides the system: Python and the project."""
    wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(PROJECT_ROOT)}
    wanted.add(str(Path(os.path.realpath(sys.executable)).parent.parent))
    paths = sorted(p for p in wanted if not any(p == s or p.startswith(s + "/") for s in _SYSTEM_RO))
    # drop paths already covered by a shorter one
    return [p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)]


def bwrap_command(
    argv: list[str],
    *,
    env: dict[str, str],
    workspace: Path,
    workdir: str,
    runtime_dir: Path,
    network: bool,
    uid: int | None,
    ro_paths: list[str],
    scratch_dir: Path,
    seccomp_fd: int | None = None,
    resolv_conf: Path | None = None,
) -> list[str]:
    """The bwrap argv running ``argv`` in the sandbox (pure: what it builds is tested).

    ``uid`` set (the worker is root): bwrap runs privileged without a user
    namespace, then ``setpriv`` drops to that uid with no capabilities, so
    RLIMIT_NPROC applies. ``uid`` None: bwrap creates a user namespace and
    the sandbox keeps the caller's uid (the rootless HPC case), and cannot make
    another. ``seccomp_fd``: bwrap loads workers/sandbox/seccomp.py's filter from it.
    ``network``: the namespace is still the sandbox's own; bwrap reports its child on
    slirp_launcher's info fd and holds the command until the launcher has brought
    ``tap0`` up, and ``resolv_conf`` (naming slirp's DNS) replaces the host's.
    ``scratch_dir`` becomes /tmp (and $HOME): on disk, so it is counted by the disk quota,
    where a tmpfs would be memory that no rlimit counts.
    """
    cmd = ["bwrap", "--die-with-parent", "--new-session"]
    cmd += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if uid is None:
        cmd += ["--unshare-user", "--disable-userns"]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd.append("--unshare-net")
    if network:
        cmd += ["--info-fd", str(slirp_launcher.INFO_FD), "--block-fd", str(slirp_launcher.BLOCK_FD)]
    cmd += ["--hostname", "sandbox"]
    for path in _SYSTEM_RO:
        cmd += ["--ro-bind-try", path, path]
    target = resolv_conf_target() if network else None
    if target is not None:
        if resolv_conf is None:
            raise ValueError("a network sandbox needs the resolv.conf that names slirp's DNS")
        cmd += ["--ro-bind", str(resolv_conf), target]
    for path in _MERGED_USR:
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    # The private /tmp goes first: a Python or checkout that lives under the host's /tmp
    # (a CI clone, a scratch venv) is bound on top of it, not hidden beneath it.
    cmd += ["--bind", str(scratch_dir), "/tmp"]
    for path in ro_paths:
        cmd += [*_traversable_parents(path), "--ro-bind", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += [*_traversable_parents(workdir), "--bind", str(workspace), workdir]
    cmd += [*_traversable_parents(str(runtime_dir)), "--bind", str(runtime_dir), str(runtime_dir)]
    cmd += ["--chdir", workdir, "--clearenv"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    if uid is not None:
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"]
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        cmd += ["--inh-caps=-all", "--bounding-set=-all"]
    cmd += ["--", *argv]
    return cmd


def _traversable_parents(path: str) -> list[str]:
    """Create a mount point's parents 0755: bwrap copies host modes (/root is 0700),
    which would lock the sandbox's unprivileged uid out of what is bound below."""
    parents = [str(p) for p in reversed(Path(path).parents) if str(p) not in ("/", "/tmp")]
    return [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]


class LocalSandbox(Sandbox):
    backend = "local"
    toolserver_python = sys.executable  # bound read-only into the sandbox

    def __init__(self, spec: SandboxSpec, workspace: Path, runtime_dir: Path, settings: Settings) -> None:
        super().__init__(spec, workspace, runtime_dir, settings)
        self.isolated, reason = bwrap_usable()
        if not self.isolated:
            if settings.sandbox_require_isolation:
                raise SandboxError(f"sandbox_require_isolation is set and {reason}")
            log.warning("UNISOLATED sandbox (plain process with rlimits only): %s", reason)
        self._slot: UidSlot | None = None

    @property
    def workdir(self) -> str:
        return self.settings.sandbox_workdir if self.isolated else str(self.workspace)

    @property
    def host_binds(self) -> list[Path]:
        return [*super().host_binds, *(Path(path) for path in readonly_paths())] if self.isolated else []

    def toolserver_argv(self) -> list[str]:
        # The tool server is this project's, from the tree bound read-only inside (PROJECT_ROOT), whatever
        # the venv's editable install points at: a git worktree's venv may name another checkout, which is
        # not bound (its import would fail) and would be another version of the server.
        argv = super().toolserver_argv()
        boot = f"import runpy, sys; sys.path.insert(0, {str(PROJECT_ROOT)!r}); "
        boot += "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
        return [argv[0], "-c", boot, *argv[2:]]  # argv[2] is the module's name, as with -m

    @property
    def launcher_reaps(self) -> bool:
        return self.isolated  # bwrap waits for its init; the fallback's launcher is the server

    @property
    def uid(self) -> int | None:
        return self._slot.uid if self._slot is not None else None

    def _acquire(self) -> None:
        # Unisolated, the sandbox keeps the worker's uid: the host paths it needs
        # (the venv, the workspace) are not necessarily reachable by another uid.
        if not self.isolated or os.geteuid() != 0 or self._slot is not None:
            return
        self._slot = UidSlot.acquire(self.settings.sandbox_uid_base, self.settings.sandbox_uid_slots)
        self._own_workspace()
        chown_tree(self.runtime_dir, self._slot.uid, self._slot.uid)

    def _own_workspace(self) -> None:
        if self._slot is not None:
            chown_tree(self.workspace, self._slot.uid, self._slot.uid)

    @property
    def poolable(self) -> str | None:
        # Unisolated, the workspace appears at its host path, which changes when a job takes the sandbox.
        return None if self.isolated else "the unisolated fallback shows the workspace at its host path"

    @property
    def scratch_inside(self) -> str:
        return "/tmp" if self.isolated else str(self.scratch_dir)

    def _release(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    def base_env(self) -> dict[str, str]:
        env = super().base_env()
        if not self.isolated:  # no /tmp of its own: $HOME and $TMPDIR name its scratch dir
            for key in ("HOME", "TMPDIR"):
                env[key] = self.spec.env.get(key, str(self.scratch_dir))
        return env

    def wrap(self, argv: list[str], env: dict[str, str]) -> list[str]:
        if self.isolated:
            command = bwrap_command(
                argv,
                env=env,
                workspace=self.workspace,
                workdir=self.workdir,
                runtime_dir=self.runtime_dir,
                network=self.spec.network,
                uid=self.uid,
                ro_paths=readonly_paths(),
                scratch_dir=self.scratch_dir,
                seccomp_fd=SECCOMP_FD,
                resolv_conf=slirp_resolv_conf() if self.spec.network else None,
            )
            if self.spec.network:
                command = network_launcher(command, userns=self.uid is None)
            return with_filter(command, SECCOMP_FD)
        return ["env", "-i", "-C", str(self.workspace), *(f"{k}={v}" for k, v in env.items()), *argv]
