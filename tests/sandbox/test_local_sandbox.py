"""Real bubblewrap sandboxes with the tool server inside: isolation, limits, teardown."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shared.config import Settings
from tests.support.waiting import wait_for
from workers.sandbox import Sandbox, SandboxError, SandboxLimits, SandboxSpec, create_sandbox

from .conftest import namespace_processes, pid_namespace_members, still_running

pytestmark = pytest.mark.usefixtures("require_bwrap")


def _pid_ns(box: Sandbox) -> str:
    result = box.call("bash", {"command": "readlink /proc/self/ns/pid"})
    assert result.exit_code == 0
    return result.output.strip()


def test_state_persists_across_calls(sandbox: Sandbox) -> None:
    assert sandbox.call("bash", {"command": "mkdir -p pkg && cd pkg && export TOKEN=abc"}).exit_code == 0
    result = sandbox.call("bash", {"command": "pwd; echo $TOKEN"})
    assert result.output == f"{sandbox.workdir}/pkg\nabc\n"
    assert not sandbox.call("python", {"code": "import os\nvalue = 6 * 7"}).is_error
    assert sandbox.call("python", {"code": "value, os.getcwd()"}).output == f"(42, '{sandbox.workdir}')\n"


def test_tools_share_the_workspace(sandbox: Sandbox, workspace: Path) -> None:
    sandbox.call("create", {"path": "src/app.py", "file_text": "print('v1')\n"})
    assert sandbox.call("str_replace", {"path": "src/app.py", "old_str": "v1", "new_str": "v2"}).is_error is False
    assert sandbox.call("bash", {"command": "python3 src/app.py"}).output == "v2\n"
    assert (workspace / "src/app.py").read_text() == "print('v2')\n"
    assert "1\tprint('v2')" in sandbox.call("view", {"path": f"{sandbox.workdir}/src/app.py"}).output


def test_bad_calls_are_error_observations(sandbox: Sandbox) -> None:
    for tool, args in [("nope", {}), ("bash", {}), ("bash", {"command": ["ls"]}), ("view", {"path": "missing"})]:
        result = sandbox.call(tool, args)
        assert result.is_error and result.output
    assert sandbox.call("bash", {"command": "echo alive"}).output == "alive\n"


def test_arguments_with_a_lone_surrogate_are_an_error_observation(sandbox: Sandbox) -> None:
    """json.loads accepts "\\ud800"; msgpack cannot encode it: the agent's mistake, not the sandbox's."""
    args = json.loads('{"command": "echo \\ud800"}')
    result = sandbox.call("bash", args)
    assert result.is_error and result.output == "arguments are not valid UTF-8"
    assert sandbox.call("bash", {"command": "echo alive"}).output == "alive\n"


def test_killed_tool_server_is_an_infrastructure_error(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError):
        sandbox.call("bash", {"command": "kill -9 $PPID"})
    sandbox.stop()
    assert not sandbox.running


def test_stop_from_another_thread_ends_a_running_call(sandbox: Sandbox) -> None:
    """A cancelled job stops its sandbox while the rollout thread waits in a tool call."""
    import threading

    errors: list[BaseException] = []

    def long_call() -> None:
        try:
            sandbox.call("bash", {"command": "sleep 4242"}, timeout=60)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    caller = threading.Thread(target=long_call)
    caller.start()
    seen = False
    for _ in range(1500):  # the call is in flight once the shell runs the sleep
        if any(_cmdline(pid) == "sleep 4242 " for pid in _all_pids()):
            seen = True
            break
        threading.Event().wait(0.02)
    assert seen, "the call never got as far as running the sleep: stop() would win the race vacuously"
    sandbox.stop()
    caller.join(20)
    assert not caller.is_alive() and len(errors) == 1 and isinstance(errors[0], SandboxError)


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_finish(sandbox: Sandbox) -> None:
    result = sandbox.call("finish", {"answer": "42"})
    assert result.finished and result.output == "42" and not result.is_error


def test_path_escapes_are_refused(sandbox: Sandbox) -> None:
    sandbox.call("bash", {"command": "ln -s /etc/passwd pw && ln -s / root"})
    for path in ["/etc/passwd", "../../etc/passwd", "pw", "root/etc/hostname"]:
        result = sandbox.call("view", {"path": path})
        assert result.is_error and "outside the workspace" in result.output
    assert sandbox.call("create", {"path": "root/tmp/evil", "file_text": "x"}).is_error


def test_system_is_read_only_and_host_is_hidden(sandbox: Sandbox) -> None:
    command = "touch /usr/x /etc/x 2>&1; ls /root; ls /home 2>&1; touch /tmp/ok ~/ok && echo writable"
    result = sandbox.call("bash", {"command": command})
    assert result.output.count("Read-only file system") == 2
    assert "writable" in result.output and "No such file" in result.output


def test_network_is_blocked(sandbox: Sandbox) -> None:
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('10.255.255.1', 80), timeout=3)\n"
        "except OSError as exc:\n"
        "    print('blocked', exc.errno)\n"
    )
    assert sandbox.call("python", {"code": code}).output.startswith("blocked")
    links = sandbox.call("bash", {"command": "cat /proc/net/dev | tail -n +3 | cut -d: -f1"})
    assert links.output.split() == ["lo"]


def test_timeout_leaves_the_shell_usable(sandbox: Sandbox) -> None:
    sandbox.call("bash", {"command": "cd /tmp"})
    result = sandbox.call("bash", {"command": "sleep 1000"}, timeout=0.5)
    assert result.timed_out and result.is_error and "timed out" in result.output
    assert sandbox.call("bash", {"command": "pwd"}).output == "/tmp\n"
    # Seconds of margin: the interrupt must find the cell running (it counts from the request).
    stuck = sandbox.call("python", {"code": "import time\ntime.sleep(1000)"}, timeout=3)
    assert stuck.timed_out and "KeyboardInterrupt" in stuck.output, stuck.output


def test_output_is_capped(sandbox: Sandbox, sandbox_settings: Settings) -> None:
    result = sandbox.call("bash", {"command": "seq 1 5000"})
    assert result.truncated and "truncated" in result.output
    assert len(result.output.encode()) < sandbox_settings.tool_output_cap_bytes + 200
    flood = sandbox.call("bash", {"command": "cat /dev/zero | tr '\\0' x"})
    assert flood.truncated and "exceeded" in flood.output
    assert sandbox.call("bash", {"command": "echo ok"}).output == "ok\n"


def test_memory_limit(workspace: Path, short_dir: Path, sandbox_settings: Settings) -> None:
    spec = SandboxSpec(limits=SandboxLimits(memory_bytes=512 * 1024**2))
    box = create_sandbox(spec, workspace, short_dir / "rt", sandbox_settings)
    result = box.exec(["python3", "-c", "bytearray(2 * 1024**3)"], timeout=30)
    assert result.exit_code == 1 and "MemoryError" in result.stderr


def test_fork_bomb_is_contained(workspace: Path, short_dir: Path, sandbox_settings: Settings) -> None:
    spec = SandboxSpec(limits=SandboxLimits(processes=32))
    with create_sandbox(spec, workspace, short_dir / "rt", sandbox_settings) as box:
        ns = _pid_ns(box)
        result = box.call("bash", {"command": "bomb() { bomb | bomb & }; bomb; sleep 5"}, timeout=3)
        assert result.is_error
        assert len(pid_namespace_members(ns)) <= 40  # 32 processes, plus bwrap's own init
    assert pid_namespace_members(ns) == []


def test_exec_for_setup_and_tests(workspace: Path, short_dir: Path, sandbox_settings: Settings) -> None:
    box = create_sandbox(SandboxSpec(env={"MODE": "test"}), workspace, short_dir / "rt", sandbox_settings)
    result = box.exec("echo out; echo err >&2; echo $MODE > marker; exit 3", timeout=30)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert (workspace / "marker").read_text() == "test\n"
    slow = box.exec(["sleep", "1000"], timeout=0.5)
    assert slow.timed_out and slow.exit_code is None and not slow.ok
    # exec leaves no file behind; only the (empty) directory that was its /tmp and bwrap's mount points in it
    assert [p for p in (short_dir / "rt").rglob("*") if not p.is_dir()] == []


def test_stop_kills_everything_it_started_and_nothing_else(
    workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        box = create_sandbox(SandboxSpec(), workspace, short_dir / "rt", sandbox_settings).start()
        ns = _pid_ns(box)
        box.call("bash", {"command": "sleep 1000 & setsid sleep 1000 & nohup sleep 1000 >/dev/null 2>&1 &"})
        box.call("python", {"code": "import subprocess; p = subprocess.Popen(['sleep', '1000'])"})
        # bash starts `&` jobs without waiting for them: wait for the event, not for a speed
        wait_for(lambda: len(pid_namespace_members(ns)) >= 6, timeout=60, what="the background sleeps")
        box.stop()
        box.stop()  # idempotent
        assert pid_namespace_members(ns) == []
        assert not (short_dir / "rt").exists()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_twenty_sandboxes_at_once(sandbox_settings: Settings) -> None:
    base = Path(os.path.realpath("/tmp")) / f"sbx20-{os.getpid()}"
    boxes = []
    for index in range(20):
        (base / f"ws{index}").mkdir(parents=True)
        boxes.append(create_sandbox(SandboxSpec(), base / f"ws{index}", base / f"rt{index}", sandbox_settings))
    try:
        with ThreadPoolExecutor(max_workers=20) as pool:
            list(pool.map(lambda box: box.start(), boxes))
            outputs = list(
                pool.map(
                    lambda pair: pair[1].call("bash", {"command": f"echo {pair[0]} > id; cat id; id -u"}),
                    enumerate(boxes),
                )
            )
        # the pool threads that started them have exited: the sandboxes must outlive them
        namespaces = [_pid_ns(box) for box in boxes]
        assert [out.output.split()[0] for out in outputs] == [str(i) for i in range(20)]
        if os.geteuid() == 0:
            assert len({out.output.split()[1] for out in outputs}) == 20  # one uid per sandbox
        assert len(set(namespaces)) == 20
        processes = [namespace_processes(ns) for ns in namespaces]
        assert all(len(members) >= 3 for members in processes), processes  # bwrap's init, the server, bash
        with ThreadPoolExecutor(max_workers=20) as pool:
            list(pool.map(lambda box: box.stop(), boxes))
        # by pid and start time: another test's new sandbox may be given a freed namespace's number
        assert [still_running(members) for members in processes] == [[]] * 20
        assert sorted(p.name for p in base.iterdir()) == sorted(f"ws{i}" for i in range(20))
    finally:
        for box in boxes:
            box.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_sandbox_outlives_the_thread_that_started_it(
    workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> None:
    import threading

    box = create_sandbox(SandboxSpec(), workspace, short_dir / "rt", sandbox_settings)
    starter = threading.Thread(target=box.start)
    starter.start()
    starter.join()
    try:
        assert box.call("bash", {"command": "echo still-here"}).output == "still-here\n"
    finally:
        box.stop()


def _start_and_call_in_child(workspace: Path, runtime_dir: Path, settings: Settings, out: object) -> None:
    with create_sandbox(SandboxSpec(), workspace, runtime_dir, settings) as box:
        out.put(box.call("bash", {"command": "echo from-child"}).output)  # type: ignore[attr-defined]


def test_sandboxes_start_in_a_forked_child(workspace: Path, short_dir: Path, sandbox_settings: Settings) -> None:
    """rq forks a work horse per job: the child must not reuse the parent's spawner thread."""
    import multiprocessing

    with create_sandbox(SandboxSpec(), workspace, short_dir / "rt", sandbox_settings) as box:
        assert box.call("bash", {"command": "true"}).exit_code == 0
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        args = (workspace, short_dir / "rt2", sandbox_settings, out)
        child = context.Process(target=_start_and_call_in_child, args=args)
        child.start()
        try:
            child.join(120)
            assert child.exitcode == 0 and out.get(timeout=60) == "from-child\n"
        finally:
            child.kill()
            child.join()


def test_concurrent_stops_close_the_uid_lock_once_and_do_not_raise(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel and the rollout's own teardown may stop one sandbox at the same moment:
    the uid slot's lock fd must be closed once (a second close could hit a reused fd)."""
    import threading

    from workers.sandbox import isolation

    if sandbox._slot is None:  # not root: give it a slot so the release path is exercised
        sandbox._slot = isolation.UidSlot(12345, os.open(os.devnull, os.O_RDONLY))
    slot_fd = sandbox._slot._fd
    target = _fd_target(slot_fd)
    closes: list[int] = []
    real_close = os.close

    def slow_close(fd: int) -> None:
        if fd == slot_fd and _fd_target(fd) == target:  # fd numbers are reused: match the file too
            closes.append(fd)
            threading.Event().wait(0.05)  # widen the window in which a second stopper could get in
        real_close(fd)

    monkeypatch.setattr(isolation.os, "close", slow_close)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def stop() -> None:
        barrier.wait()
        try:
            sandbox.stop()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=stop) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and not sandbox.running and not sandbox.socket_path.exists()
    assert closes == [slot_fd]


def test_uid_slot_release_closes_its_fd_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from workers.sandbox import isolation

    slot = isolation.UidSlot(12345, os.open(os.devnull, os.O_RDONLY))
    slot_fd = slot._fd
    target = _fd_target(slot_fd)
    closes: list[int] = []
    real_close = os.close

    def slow_close(fd: int) -> None:
        if fd == slot_fd and _fd_target(fd) == target:  # fd numbers are reused: match the file too
            closes.append(fd)
            threading.Event().wait(0.02)
        real_close(fd)

    monkeypatch.setattr(isolation.os, "close", slow_close)
    threads = [threading.Thread(target=slot.release) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert closes == [slot_fd]


def _fd_target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""
