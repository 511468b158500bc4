"""Lifetime ``reuse`` with real bubblewrap sandboxes: job B, in the sandbox job A used, sees nothing A left;
a reset that cannot be proven clean ends in a discarded sandbox, and the next job still runs clean.

The pool here starts nothing itself (``refill=False``): the only sandbox it can hand out is the one
job A gave back, so a job that gets a pooled sandbox gets A's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.config import Settings
from tests.support.waiting import wait_for
from workers.rollout.job_sandbox import JobSandbox, open_job_sandbox
from workers.sandbox import SandboxError, SandboxLimits, SandboxSpec
from workers.sandbox.pool import SandboxPool
from workers.sandbox.pool_sizing import Demand
from workers.sandbox.profile import SandboxProfile
from workers.sandbox.reset import server_host_pid

pytestmark = pytest.mark.usefixtures("require_bwrap")

PORT = 8765


@pytest.fixture()
def reuse_settings(short_dir: Path, sandbox_settings: Settings) -> Settings:
    return sandbox_settings.model_copy(update={"state_dir": short_dir / "st"})


@pytest.fixture()
def pool(reuse_settings: Settings) -> Iterator[SandboxPool]:
    made = SandboxPool(reuse_settings, lambda: Demand(free_slots=1, queue_depth=1), refill=False)
    yield made
    made.close()


def _job(settings: Settings, pool: SandboxPool, name: str, files: dict[str, str], spec: SandboxSpec) -> JobSandbox:
    ws = settings.workspaces / name
    ws.mkdir(parents=True)
    for path, text in files.items():
        (ws / path).write_text(text)
    return open_job_sandbox(spec, ws, settings, python=True, lifetime="reuse", pool=pool)


def _bash(held: JobSandbox, command: str) -> str:
    result = held.sandbox.call("bash", {"command": command})
    assert not result.timed_out, result.output
    return result.output


def _give_back_and_wait(pool: SandboxPool, held: JobSandbox) -> bool:
    """Job A ends; whether its sandbox came back ready (reset proven clean, shell and kernel up)."""
    discarded, running = pool.stats.discarded, held.sandbox.running
    held.finish()
    if not running:
        return False  # a dead sandbox is stopped, never offered
    wait_for(
        lambda: pool.ready_count(held.profile) or pool.stats.discarded > discarded,
        timeout=120,
        what=lambda: f"the sandbox back or discarded ({pool.stats})",
    )
    return pool.stats.discarded == discarded


def _assert_clean(held: JobSandbox, own_files: set[str]) -> None:
    """What job B sees: only its own files, and nothing job A made or changed."""
    assert set(_bash(held, "ls -A").split()) == own_files
    tmp = set(_bash(held, "ls -A /tmp").split())
    assert not tmp & {"a-was-here", "locked"}, tmp
    assert _bash(held, 'pwd; echo "[$LEAKED]"') == "/workspace\n[]\n"
    processes = _bash(held, "ps -e -o args")
    assert "sleep 100" not in processes and "hop.py" not in processes and "listen.py" not in processes, processes
    assert "<defunct>" not in processes, processes
    assert _bash(held, f"(exec 3<>/dev/tcp/127.0.0.1/{PORT}) 2>/dev/null && echo open || echo closed") == "closed\n"
    assert held.sandbox.call("python", {"code": "'leaked' in globals()"}).output == "False\n"
    code = "import os; (os.getcwd(), os.environ.get('KERNEL_LEAK'))"
    assert held.sandbox.call("python", {"code": code}).output == "('/workspace', None)\n"


LISTEN = f"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT})); s.listen(); open("/tmp/listening", "w").close()
time.sleep(1000)
"""


def test_job_b_sees_nothing_job_a_left_in_a_reused_sandbox(pool: SandboxPool, reuse_settings: Settings) -> None:
    a = _job(reuse_settings, pool, "job-a", {"listen.py": LISTEN}, SandboxSpec())
    try:
        _bash(a, "echo a > a-file; echo a > /tmp/a-was-here; mkdir -p sub; export LEAKED=yes; cd sub")
        _bash(a, "setsid sleep 1001 >/dev/null 2>&1 </dev/null &")  # a daemon in a session of its own
        _bash(a, "( ( sleep 1002 & ) & ); nohup sleep 1003 >/dev/null 2>&1 &")  # double-forked, nohup
        _bash(a, "setsid python3 /workspace/listen.py >/dev/null 2>&1 </dev/null &")
        _bash(a, "until [ -e /tmp/listening ]; do sleep 0.05; done")  # an event, not a pace
        # (bash may print "[2]+ Done setsid ..." first: setsid forked the listener off and its job ended)
        assert _bash(a, f"(exec 3<>/dev/tcp/127.0.0.1/{PORT}) 2>/dev/null && echo open").splitlines()[-1] == "open"
        code = "import os; leaked = 42; os.environ['KERNEL_LEAK'] = '1'; os.chdir('/tmp')"
        assert not a.sandbox.call("python", {"code": code}).is_error
        assert "sleep 1001" in _bash(a, "ps -e -o args")
    except BaseException:
        a.finish()
        raise
    assert _give_back_and_wait(pool, a), pool.stats.last_discard
    # A's files stay where its eval reads them
    assert {p.name for p in (reuse_settings.workspaces / "job-a").iterdir()} == {"listen.py", "a-file", "sub"}

    b = _job(reuse_settings, pool, "job-b", {"b-file": "b"}, SandboxSpec())
    try:
        assert b.sandbox is a.sandbox  # the same sandbox, reset
        assert pool.stats.reused == 1 and pool.stats.handed == 1
        _assert_clean(b, {"b-file"})
    finally:
        b.finish()


TAMPER = {
    "untouched": "",
    "restarted by the job": "os.kill(os.getppid(), signal.SIGKILL); os._exit(0)",  # the next call starts one
    "stopped by the job": "os.kill(os.getppid(), signal.SIGSTOP)",
    "its limits lowered by the job": "resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (64, 64))",
}


def _fork_server(held: JobSandbox) -> str:
    """The pid (inside) of the fork server the job's kernel was forked from."""
    return held.sandbox.call("python", {"code": "import os; os.getppid()"}).output


@pytest.mark.parametrize("tamper", list(TAMPER))
def test_only_a_fork_server_no_job_could_touch_is_kept(
    pool: SandboxPool, reuse_settings: Settings, tamper: str
) -> None:
    """Each of a reused sandbox's kernels is a fork of its kernel fork server, which the reset keeps for the next
    job only when it is the one the pool's warm-up started (no job's code had run) and no job changed it: job A
    started its sandbox cold (its fork server came up during the job: not kept), B got the warm-up's, C gets
    B's again unless B restarted, stopped or limited it; either way C's kernel works and the sandbox is reused."""
    jobs: list[JobSandbox] = []
    servers: list[str] = []
    try:
        for name in ("a", "b", "c"):
            held = _job(reuse_settings, pool, f"job-{name}", {}, SandboxSpec())
            jobs.append(held)
            servers.append(_fork_server(held))
            if name == "b" and TAMPER[tamper]:
                held.sandbox.call("python", {"code": f"import os, resource, signal; {TAMPER[tamper]}"})
                if tamper == "restarted by the job":
                    assert _fork_server(held) != servers[-1]  # a new one, started while B ran
            if name != "c":
                assert _give_back_and_wait(pool, held), pool.stats.last_discard
        a, b, c = jobs
        assert a.sandbox is b.sandbox is c.sandbox and pool.stats.reused == 2
        assert servers[1] != servers[0]  # A's came up during A: never kept
        assert (servers[2] == servers[1]) == (tamper == "untouched"), (tamper, servers)
        assert c.sandbox.call("python", {"code": "6 * 7"}).output == "42\n"
    finally:
        for held in jobs:
            held.finish()


def test_a_stop_after_the_give_back_does_not_touch_the_next_jobs_sandbox(
    pool: SandboxPool, reuse_settings: Settings
) -> None:
    a = _job(reuse_settings, pool, "job-a", {}, SandboxSpec())
    assert _give_back_and_wait(pool, a)
    b = _job(reuse_settings, pool, "job-b", {}, SandboxSpec())
    try:
        assert b.sandbox is a.sandbox
        a.stop()  # job A's late cancel or cleanup
        assert b.sandbox.running
        assert _bash(b, "echo alive") == "alive\n"
    finally:
        b.finish()


HOP = """
import os, time
while True:
    try:
        if os.fork():
            os._exit(0)
    except OSError:
        time.sleep(0.001)
"""


def _hostile_then_clean(pool: SandboxPool, settings: Settings, spec: SandboxSpec, hostile: str) -> JobSandbox:
    """Job A does ``hostile``; job B still runs clean, in a fresh sandbox or a proven-clean one."""
    a = _job(settings, pool, "job-a", {"hop.py": HOP}, spec)
    with contextlib.suppress(SandboxError):  # the hostile act ended the sandbox (the disk quota)
        a.sandbox.call("bash", {"command": hostile})
    reused = _give_back_and_wait(pool, a)
    b = _job(settings, pool, "job-b", {"b-file": "b"}, spec)
    try:
        assert (b.sandbox is a.sandbox) == reused
        _assert_clean(b, {"b-file"})
    except BaseException:
        b.finish()
        raise
    return b


def test_a_process_that_respawns_itself_never_reaches_the_next_job(pool: SandboxPool, reuse_settings: Settings) -> None:
    """Processes that fork and exit without pause: a reset's one kill pass that misses a generation
    (born during the pass) ends in a discarded sandbox; one that catches them all is proven clean."""
    spec = SandboxSpec(limits=SandboxLimits(processes=256))
    hop = "for i in 1 2 3 4; do setsid python3 hop.py >/dev/null 2>&1 </dev/null & done"
    b = _hostile_then_clean(pool, reuse_settings, spec, hop)
    try:
        if pool.stats.discarded:
            assert "processes" in (pool.stats.last_discard or ""), pool.stats.last_discard
    finally:
        b.finish()


def test_a_tree_the_sandbox_cannot_remove_discards_it(pool: SandboxPool, reuse_settings: Settings) -> None:
    locked = "mkdir -p /tmp/locked/deep && touch /tmp/locked/deep/f && chmod 000 /tmp/locked"
    b = _hostile_then_clean(pool, reuse_settings, SandboxSpec(), locked)
    try:
        assert pool.stats.discarded == 1 and "cannot remove" in (pool.stats.last_discard or "")
        assert pool.stats.reused == 0
    finally:
        b.finish()


def test_a_sandbox_that_filled_its_disk_is_never_reused(pool: SandboxPool, reuse_settings: Settings) -> None:
    settings = reuse_settings.model_copy(update={"sandbox_disk_check_interval_s": 0.05})
    spec = SandboxSpec(limits=SandboxLimits(disk_bytes=16 * 1024**2))
    b = _hostile_then_clean(pool, settings, spec, "while :; do head -c 4M /dev/zero > /tmp/fill$RANDOM; done")
    try:
        assert pool.stats.reused == 0
        assert b.sandbox.over_quota is None
    finally:
        b.finish()


def test_a_sandbox_whose_tool_server_died_is_never_reused(pool: SandboxPool, reuse_settings: Settings) -> None:
    a = _job(reuse_settings, pool, "job-a", {}, SandboxSpec())
    with pytest.raises(SandboxError):
        a.sandbox.call("bash", {"command": "kill -9 $PPID"})
    a.finish()
    assert not a.sandbox.running
    profile = SandboxProfile.of(SandboxSpec(), reuse_settings, python=True)
    assert pool.take(profile) is None


def test_a_file_left_outside_the_workspace_and_tmp_discards_the_sandbox(
    pool: SandboxPool, reuse_settings: Settings
) -> None:
    """Rootless, the sandbox's user owns bwrap's in-memory / and /dev; as root it does not, so the file is put
    there from outside, through /proc/<pid>/root, as such a job would have left it."""
    a = _job(reuse_settings, pool, "job-a", {}, SandboxSpec())
    server = server_host_pid(a.sandbox, a.sandbox.control({"op": "ping"}, 5.0)["pid"])
    assert server is not None
    Path(f"/proc/{server}/root/dev/shm/left-by-a").write_text("secret")
    assert not _give_back_and_wait(pool, a)
    assert "dev/shm/left-by-a" in (pool.stats.last_discard or ""), pool.stats.last_discard
