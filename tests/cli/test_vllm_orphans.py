"""vLLM's whole process tree ends with the process that started it (cli/vllm_watchdog.py).

The starter is a separate Python process that starts a `VLLMServer` and is then SIGKILLed, as a
`rollouts up` killed outright: no cleanup of its own runs. The fast tests use `EngineDouble`, a test
double of vLLM's process shape (an API process whose "engine" child shares its process group and
ignores SIGTERM, as an orphaned engine stays up); the `vllm` test starts the real vLLM server on the
tiny model. Processes are found by the session the watchdog leads, never by name, and only the
ones these tests started are signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli.vllm_server import VLLMServer
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

# The double: writes its pid and its engine's, ignores nothing itself, exits on SIGTERM after
# noting it; the engine ignores SIGTERM (only SIGKILL ends it). `exit:N` as argv[1]: the API
# process exits with N on its own once the engine runs, leaving the engine behind.
ENGINE_DOUBLE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    out = sys.argv[1]
    engine = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
    def stopped(*_):
        open(out + ".graceful", "w").close()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stopped)  # before the pid file: a test acts on its pids at once
    with open(out + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {engine.pid}")
    os.rename(out + ".tmp", out)
    if len(sys.argv) > 2:
        sys.exit(int(sys.argv[2]))
    time.sleep(3600)
""")

STARTER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from tests.cli.test_vllm_orphans import _double, real_server
    server = {make}
    server.start()
    {ready}
    print(server.process.pid, flush=True)
    time.sleep(3600)
""")


class EngineDouble(VLLMServer):
    """A test double of vLLM's process tree (no LLM): `VLLMServer.start` runs it under the watchdog."""

    def command(self) -> list[str]:
        return [sys.executable, str(self.model / "double.py"), *self.args]

    def environment(self) -> dict[str, str]:
        return dict(os.environ)


def _double(model: Path, *args: str) -> EngineDouble:
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({}))
    (model / "double.py").write_text(ENGINE_DOUBLE)
    return EngineDouble(python=Path(sys.executable), model=model, served_name="double", port=1, args=list(args))


def real_server(model: str, log: str) -> VLLMServer:
    from cli.embedded_redis import free_port
    from shared.config import Settings
    from tests.support.vllm_server import TEST_VLLM_ARGS

    return VLLMServer.from_settings(
        Settings(),
        Path(model),
        free_port(),
        served_name="tiny",
        log_path=Path(log),
        args=[*TEST_VLLM_ARGS, "--max-model-len", "4096"],
    )


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (the watchdog's; only what it started)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _kill_starter_and_check_tree_ends(make: str, ready: str, wanted: int, timeout: float) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER.format(root=str(ROOT), make=make, ready=ready)],
        stdout=subprocess.PIPE,
        text=True,
    )
    watchdog = 0
    try:
        watchdog = int(starter.stdout.readline())
        members = wait_for(
            lambda: len(session_members(watchdog)) >= wanted and session_members(watchdog),
            timeout=timeout,
            what=f"{wanted} processes in vLLM's session",
        )
        starter.kill()  # as `rollouts up` SIGKILLed: nothing of its own runs
        starter.wait()
        wait_for(lambda: not session_members(watchdog), timeout=120, what=f"{members} to end with their starter")
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        if watchdog:
            for pid in session_members(watchdog):  # only the session these tests started
                os.kill(pid, signal.SIGKILL)


def test_a_killed_starter_takes_the_whole_tree(tmp_path: Path) -> None:
    """Watchdog, API process and an engine that ignores SIGTERM: all end when the starter is SIGKILLed."""
    out = tmp_path / "pids"
    make = f"_double(Path({str(tmp_path / 'model')!r}), {str(out)!r})"
    ready = f"import os, time\nwhile not os.path.exists({str(out)!r}): time.sleep(0.05)"
    _kill_starter_and_check_tree_ends(make, ready, wanted=3, timeout=60)


def test_an_exited_server_leaves_no_engine_behind(tmp_path: Path) -> None:
    """vLLM's API process exits on its own: the watchdog kills its engine and exits with its status."""
    out = tmp_path / "pids"
    server = _double(tmp_path / "model", str(out), "3").start()
    try:
        assert server.process is not None
        assert server.process.wait(timeout=120) == 3
        _, engine = map(int, out.read_text().split())
        wait_for(lambda: not session_members(server.process.pid), timeout=60, what="the engine to be killed")
        assert not Path(f"/proc/{engine}").exists() or "Z" in Path(f"/proc/{engine}/stat").read_text().split()[2]
    finally:
        server.stop()


def test_stop_still_reaches_the_server_first(tmp_path: Path) -> None:
    """The orderly stop: SIGTERM to the group reaches vLLM itself (it shuts down), then nothing is left."""
    out = tmp_path / "pids"
    server = _double(tmp_path / "model", str(out)).start()
    assert server.process is not None
    watchdog = server.process.pid
    wait_for(out.exists, timeout=60, what="the double to start")
    server.stop(timeout_s=60)
    assert Path(f"{out}.graceful").exists(), "the API process got the SIGTERM and shut down"
    assert session_members(watchdog) == []


@pytest.mark.vllm
def test_a_killed_starter_takes_the_real_vllm_engine(tiny_model: Path, tmp_path: Path) -> None:
    """The real thing: vLLM on the tiny model, ready; its starter SIGKILLed; no process of it remains."""
    make = f"real_server({str(tiny_model)!r}, {str(tmp_path / 'vllm.log')!r})"
    # watchdog, the API server and its EngineCore at least
    _kill_starter_and_check_tree_ends(make, "server.wait_until_ready(timeout_s=900)", wanted=3, timeout=900)
