"""The persistent IPython kernel on the ipc transport."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.toolserver.python import PythonKernel


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PythonKernel]:
    base = tmp_path_factory.mktemp("k")
    env = {"PATH": os.environ["PATH"], "HOME": str(base)}
    k = PythonKernel(base, env, base / "state")
    k.start()
    yield k
    k.close()


def test_uses_unix_sockets_not_tcp(kernel: PythonKernel) -> None:
    info = kernel.client.get_connection_info()  # type: ignore[union-attr]
    assert info["transport"] == "ipc"
    assert os.path.exists(f"{info['ip']}-{info['shell_port']}")


def test_state_result_streams_and_traceback(kernel: PythonKernel) -> None:
    assert kernel.run("x = 20\nprint('hello')", 30).stdout == "hello\n"
    out = kernel.run("import sys; print('warn', file=sys.stderr); x + 22", 30)
    assert out.result == "42" and out.stderr == "warn\n" and out.error is None
    err = kernel.run("1 / 0", 30)
    assert err.error is not None and "ZeroDivisionError" in err.error and "\x1b[" not in err.error


def test_timeout_interrupts_and_keeps_state(kernel: PythonKernel) -> None:
    kernel.run("kept = 'yes'", 30)
    # The timeout counts from the request: seconds of margin, so the interrupt finds the loop running.
    out = kernel.run("import time\nwhile True: time.sleep(0.05)", 3)
    assert out.timed_out and not out.restarted and "KeyboardInterrupt" in (out.error or ""), out
    assert kernel.run("kept", 30).result == "'yes'"


def test_render_caps_output(kernel: PythonKernel) -> None:
    text, truncated = kernel.run("print('z' * 50000)", 30).render(1000)
    assert truncated and "truncated" in text and len(text) < 1200


def test_kernel_ignoring_interrupts_is_restarted(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    kernel = PythonKernel(tmp_path, env, tmp_path / "state")
    kernel.start()
    try:
        kernel.run("lost = 1", 30)
        code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
        # Seconds of margin: an interrupt landing before the cell ignored SIGINT would just stop it.
        out = kernel.run(code, 5)
        assert out.timed_out and out.restarted, out
        after = kernel.run("'lost' in dir(), 6 * 7", 30)
        assert after.result == "(False, 42)"
    finally:
        kernel.close()


def test_runaway_output_is_capped_while_collecting_and_interrupted(tmp_path: Path) -> None:
    """Output is bounded as it arrives, not only when rendered; past the hard cap the run stops."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    kernel = PythonKernel(tmp_path, env, tmp_path / "state", output_cap=1000, hard_output_cap=20_000)
    kernel.start()
    try:
        kernel.run("kept = 'yes'", 30)
        out = kernel.run("import sys\nwhile True: sys.stdout.write('y' * 1000 + '\\n')", 60)
        assert out.overflowed and not out.timed_out and out.truncated
        assert len(out.stdout) < 1200 and "truncated" in out.stdout
        assert "KeyboardInterrupt" in (out.error or "") and not out.restarted
        assert kernel.run("kept", 30).result == "'yes'"
        small = kernel.run("print('z' * 5000)", 30)
        assert small.truncated and not small.overflowed and len(small.stdout) < 1200
    finally:
        kernel.close()


def test_dead_kernel_is_restarted_and_reported_not_timed_out(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    kernel = PythonKernel(tmp_path, env, tmp_path / "state")
    kernel.start()
    try:
        kernel.run("lost = 1", 30)
        out = kernel.run("import os\nos._exit(3)", 120)
        assert not out.timed_out and out.restarted and out.died
        assert "the Python kernel died (restarted; state was lost)" in (out.error or "")
        assert kernel.run("'lost' in dir(), 6 * 7", 30).result == "(False, 42)"
    finally:
        kernel.close()


def test_fd_level_output_arrives_before_the_call_returns(kernel: PythonKernel) -> None:
    """Output written to fds 1 and 2 by the kernel's children is drained at the end of each execution."""
    kernel.run("import os, subprocess, sys", 30)
    for _ in range(20):
        assert kernel.run("os.system('echo from-shell')", 30).stdout == "from-shell\n"
        assert kernel.run("subprocess.run(['sh', '-c', 'echo oops >&2'])", 30).stderr == "oops\n"
        assert kernel.run("os.write(1, 'é'.encode() * 3)", 30).stdout == "ééé"


def test_many_writes_all_arrive_in_order(kernel: PythonKernel) -> None:
    out = kernel.run("for i in range(3000): print(i)", 30)
    assert out.stdout == "".join(f"{i}\n" for i in range(3000))
    out = kernel.run("import sys; print('a', flush=True); print('b', file=sys.stderr); 7", 30)
    assert (out.stdout, out.stderr, out.result) == ("a\n", "b\n", "7")


def test_output_of_forked_children_still_arrives(kernel: PythonKernel) -> None:
    code = (
        "import multiprocessing as mp\n"
        "def work(i):\n    print('child', i, flush=True)\n    return i * i\n"
        "with mp.get_context('fork').Pool(2) as pool:\n    squares = pool.map(work, range(3))\n"
        "squares"
    )
    out = kernel.run(code, 60)
    assert out.result == "[0, 1, 4]" and out.error is None
