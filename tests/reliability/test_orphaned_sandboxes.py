"""A rollout worker SIGKILLed with sandboxes open: one in use mid-tool-call, ready ones in its pool.

Nothing of them may outlive the worker: no bubblewrap, tool server or IPython kernel process for more
than a few seconds (the parent-death signals, workers/sandbox/host_processes.py), no runtime dir or pool
directory once a worker starts again on the node (workers/sandbox/owner.py), and the job's record names
the sandbox each attempt used, so an operator who finds one on a node joins it to its rollout.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.stack import Stack
from tests.reliability.agent_stack import (
    argv_of,
    call,
    descendants,
    find_process,
    kill,
    rollout_worker,
    scripted_agent_stack,
    submit,
)
from tests.support.waiting import client_for, job, wait_for, wait_status
from workers.sandbox.owner import POOL_DIR, alive, owner_tag, start_ticks, sweep
from workers.toolserver.kernel_forks import KERNEL_NAME

ENV = {
    "ROLLOUTS_HEARTBEAT_TTL_S": "4",  # the killed worker's job is abandoned, and re-queued, soon
    "ROLLOUTS_SANDBOX_POOL_INTERVAL_S": "0.5",
}
FINISH = "Done. " + call("finish", answer="ok")
# Holds only the first attempt: the re-run finds `.held` in the job's workspace and goes on.
HOLD = "if [ ! -e .held ]; then touch .held started; sleep 300; fi; echo again"
SCRIPTS = {
    "teach": [call("python", code="print(1)"), FINISH],  # the pool learns the profile from this job
    "held": [call("bash", command=HOLD, timeout=300), FINISH],
}


@dataclass(frozen=True)
class Proc:
    """A process as it was seen: its pid and start time name it, even after the pid is reused."""

    pid: int
    start: int
    argv: tuple[str, ...]
    name: str  # /proc/<pid>/comm: a forked kernel keeps its fork server's argv, not its name

    @property
    def program(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv else ""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, tokenizer: Any) -> Iterator[Stack]:
    with scripted_agent_stack(tmp_path_factory.mktemp("orphaned-sandboxes"), model_dir, ENV, SCRIPTS, tokenizer) as up:
        yield up


def test_a_killed_rollout_worker_leaves_no_sandbox_behind(stack: Stack, figure) -> None:
    """SIGKILL of the rollout worker while a job's pooled sandbox runs `sleep` and the pool holds a ready
    one: every bwrap, tool server and kernel of that worker is gone within seconds, its sandboxes'
    runtime and pool directories are gone once a worker starts again on the node, the job runs again
    elsewhere to `done`, and its record names the sandbox of each attempt (the killed one's included)."""
    api = client_for(stack)
    worker = rollout_worker(stack)
    owner = f"{worker}.{start_ticks(worker)}"
    taught = wait_status(api, submit(api, "teach", kind="agent-tools"), timeout=120)
    assert taught["status"] == "done", taught.get("error")
    wait_for(lambda: _sandboxes_up(worker, count=1), timeout=120, what="the pool to have a ready sandbox")
    wait_for(lambda: _kernels_idle(worker), timeout=120, what="the pooled sandbox's kernel to have started")

    job_id = submit(api, "held", kind="agent-tools")
    wait_for((stack.settings.workspaces / job_id / "started").exists, timeout=120, what="the held call to run")
    in_use = _server_of(worker)
    assert _pooled(worker, in_use, stack.settings.workspaces / POOL_DIR), "the job did not take the ready sandbox"
    tree = wait_for(lambda: _sandboxes_up(worker, count=2), timeout=120, what="a ready sandbox beside the job's")
    runtime_dirs, homes = _dirs_of(tree, owner), _pool_homes(stack, owner)
    assert len(runtime_dirs) >= 2 and homes, (runtime_dirs, homes)  # the job's and the spare's; the spare's home
    running = job(api, job_id)
    assert running["sandboxes"]["rollout"]["1"].endswith(_runtime_of(in_use).name.removeprefix("ro-")), running

    killed = time.monotonic()
    kill(worker)
    wait_for(lambda: not _left(tree, owner), timeout=30, what=lambda: f"orphans to go: {_left(tree, owner)}")
    gone_after = time.monotonic() - killed
    dirs_left = [path for path in [*runtime_dirs, *homes] if path.exists()]  # nothing ran to remove them

    (dead,) = stack.workers["rollout"]
    dead.wait()
    stack.workers["rollout"].remove(dead)
    restarted = time.monotonic()
    stack.start_worker("rollout")  # a worker starting on the node sweeps what dead ones left
    wait_for(lambda: not any(p.exists() for p in [*runtime_dirs, *homes]), timeout=60, what="the dead's dirs to go")
    swept_after = time.monotonic() - restarted

    record = wait_status(api, job_id, timeout=180)
    assert record["status"] == "done", record.get("error")
    assert record["attempts"]["rollout"] >= 2 and record["lost"].get("rollout", 0) >= 1, record
    named = record["sandboxes"]["rollout"]
    assert named["1"] == running["sandboxes"]["rollout"]["1"] and named["2"] != named["1"], named
    assert f"-{owner}-" in named["1"], (owner, named)  # the id says which worker process ran it
    wait_for(lambda: not (stack.settings.workspaces / job_id).exists(), timeout=30, what="the job's workspace to go")
    assert not _pool_homes(stack, owner) and not _runtime_dirs_named(runtime_dirs[0].parent, owner)

    programs = _count(tree)
    figure(
        f"rollout worker SIGKILLed with {programs.get('toolserver', 0)} sandboxes open (1 in use, the rest ready): "
        f"{len(tree)} processes ({programs}) all gone {gone_after:.2f} s after the kill; "
        f"{len(dirs_left)} of {len(runtime_dirs) + len(homes)} directories left until a worker started again, "
        f"swept {swept_after:.1f} s after its start; job done {time.monotonic() - killed:.1f} s after the kill "
        f"(rollout attempts {record['attempts']['rollout']}), record names sandboxes {named}"
    )


def test_a_sweep_removes_only_what_dead_workers_left(tmp_path: Path) -> None:
    """Owners are matched by pid and start time: a live worker's directories stay, a dead one's go, and so do
    those of a pid now reused by another process; another node's pool directories and names that are not a
    worker's are left alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    own_pid, own = os.getpid(), owner_tag()
    reused = f"{own_pid}.{int(own.split('.')[1]) + 1}"  # this pid, another start: a dead worker's pid reused
    host, tmp, root = socket.gethostname(), tmp_path / "tmp", tmp_path / POOL_DIR
    dead = [tmp / f"ro-{gone.pid}.1-ab12", tmp / f"ro-{reused}-cd34", tmp / f"ro-{gone.pid}.1-seccomp-x_y"]
    dead += [root / f"{host}-{gone.pid}.1-ab12", root / f"{host}-{gone.pid}-abc"]  # the latter named before start times
    kept = [tmp / f"ro-{own}-ef56", tmp / "ro-seccomp-k9", tmp / "ro-0123456789ab", root / f"{host}-{own}-ef56"]
    kept += [root / f"other-{host}-{gone.pid}.1-ab12", root / f"{host}-{own_pid}-abc"]
    for path in [*dead, *kept]:
        (path / "left").mkdir(parents=True)
    swept = sweep(root, tmp=tmp)
    assert sorted([*swept.runtime_dirs, *swept.pool_homes]) == sorted(dead)
    assert all(path.exists() for path in kept) and not any(path.exists() for path in dead)


_SPAWNS = """
import sys, time
from workers.sandbox.host_processes import spawn
print(spawn(["sleep", "300"]).pid, flush=True)
time.sleep(300)
"""


def test_what_a_worker_spawns_dies_with_it_from_the_fork_on(tmp_path: Path) -> None:
    """Every sandbox process is spawned armed with a parent-death signal before it execs (not only once bwrap
    arms its own): a launcher that is not bwrap (here `sleep`; the unisolated fallback's tool server, the
    shell that opens bwrap's seccomp filter) dies with its SIGKILLed worker instead of living on."""
    worker = subprocess.Popen([sys.executable, "-c", _SPAWNS], stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    assert worker.stdout is not None
    child = int(worker.stdout.readline())
    seen = start_ticks(child)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    try:
        wait_for(lambda: not alive(child, seen), timeout=30, what=f"the spawned sleep {child} to die with its worker")
    finally:
        if alive(child, seen):
            os.kill(child, signal.SIGKILL)


def _server_of(worker: int) -> Proc:
    """The tool server of the sandbox running the held `sleep` (the job's, taken from the pool)."""
    sleeper = find_process(worker, "sleep", "300")
    for pid in descendants(worker):
        if _is_server(_seen(pid)) and sleeper in descendants(pid):
            return _seen(pid)
    raise AssertionError("the held call's tool server is not under the worker")


def _pooled(worker: int, server: Proc, pool_root: Path) -> bool:
    """Whether the tool server's sandbox was started by the pool: its bwrap bound a pool directory."""
    launchers = [pid for pid in descendants(worker) if server.pid in descendants(pid)]
    return any(arg.startswith(f"{pool_root}/") for pid in launchers for arg in argv_of(pid))


def _is_server(proc: Proc) -> bool:
    """The tool server itself (bwrap's argv carries the server's too; the program tells them apart)."""
    return proc.program.startswith("python") and "workers.toolserver" in proc.argv


def _is_kernel(proc: Proc) -> bool:
    return proc.name == KERNEL_NAME


def _seen(pid: int) -> Proc:
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        name = ""
    return Proc(pid, start_ticks(pid) or -1, tuple(argv_of(pid)), name)


def _kernels_idle(worker: int) -> bool:
    """Whether the worker's kernels used no CPU over half a second: started and answered, so the pool's warm-up
    call returned and its sandbox is ready (a kernel process alone is not: under two xdist workers a job could
    reach its first call while the pool's kernel still started, and start its own sandbox)."""
    kernels = [pid for pid in descendants(worker) if _is_kernel(_seen(pid))]
    before = [_cpu_ticks(pid) for pid in kernels]
    time.sleep(0.5)
    return bool(kernels) and before == [_cpu_ticks(pid) for pid in kernels]


def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1
    return int(fields[11]) + int(fields[12])


def _sandboxes_up(worker: int, count: int) -> list[Proc] | None:
    """The worker's whole sandbox tree, once ``count`` tool servers each run a kernel."""
    tree = [_seen(pid) for pid in descendants(worker)]
    servers = [p for p in tree if _is_server(p)]
    kernels = [p for p in tree if _is_kernel(p)]
    return tree if len(servers) >= count and len(kernels) >= count else None


def _runtime_of(server: Proc) -> Path:
    """A tool server's runtime dir: its socket's directory (`--socket <runtime dir>/tools.sock`)."""
    return Path(server.argv[server.argv.index("--socket") + 1]).parent


def _dirs_of(tree: list[Proc], owner: str) -> list[Path]:
    servers = {_runtime_of(p) for p in tree if _is_server(p)}
    assert all(d.name.startswith(f"ro-{owner}-") for d in servers), (owner, servers)
    return sorted(servers)


def _pool_homes(stack: Stack, owner: str) -> list[Path]:
    root = stack.settings.workspaces / POOL_DIR
    return sorted(p for p in root.iterdir() if f"-{owner}-" in p.name) if root.exists() else []


def _runtime_dirs_named(tmp: Path, owner: str) -> list[Path]:
    return sorted(tmp.glob(f"ro-{owner}-*"))


def _left(tree: list[Proc], owner: str) -> list[str]:
    """What still runs of the dead worker's sandboxes: a process seen under it (same pid and start time), or
    any process whose argv names one of its runtime dirs (`ro-<pid>.<start>-`, e.g. one started late)."""
    marker = re.compile(rf"ro-{re.escape(owner)}-")
    left = [f"{p.pid} {p.program}" for p in tree if alive(p.pid, p.start)]
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry), None) and any(marker.search(a) for a in argv_of(int(entry))):
            left.append(f"{entry} {' '.join(argv_of(int(entry)))[:80]}")
    return left


def _count(tree: list[Proc]) -> dict[str, int]:
    """The tree by role: bwrap, tool servers, kernels, and the rest (shells, the held sleep, launchers)."""
    counts: dict[str, int] = {}
    for proc in tree:
        if _is_server(proc):
            role = "toolserver"
        elif _is_kernel(proc):
            role = "kernel"
        else:
            role = proc.program or "?"
        counts[role] = counts.get(role, 0) + 1
    return counts
