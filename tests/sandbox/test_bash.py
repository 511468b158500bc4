"""The persistent shell on its own (no sandbox): state, exit codes, timeouts, caps."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.toolserver.bash import PersistentBash


@pytest.fixture()
def shell(tmp_path: Path) -> Iterator[PersistentBash]:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    bash = PersistentBash(tmp_path, env, tmp_path / ".state", output_cap=1000, hard_output_cap=100_000)
    bash.start()
    yield bash
    bash.close()


def test_cwd_env_and_functions_persist(shell: PersistentBash, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert shell.run('cd sub && export GREETING=hi && f() { echo "f:$1"; }', 10).exit_code == 0
    out = shell.run("pwd; echo $GREETING; f x", 10)
    assert out.output == f"{tmp_path}/sub\nhi\nf:x\n"


def test_exact_exit_codes_and_output(shell: PersistentBash) -> None:
    assert shell.run("exit_with() { return $1; }; exit_with 42", 10).exit_code == 42
    assert shell.run("false", 10).exit_code == 1
    assert shell.run("printf 'no newline'", 10).output == "no newline"
    out = shell.run("echo out; echo err >&2", 10)
    assert out.output == "out\nerr\n" and out.exit_code == 0


def test_multiline_and_syntax_errors_are_one_call(shell: PersistentBash) -> None:
    out = shell.run("for i in 1 2 3; do\n  echo $i\ndone", 10)
    assert out.output == "1\n2\n3\n"
    bad = shell.run("if then fi", 10)
    assert bad.exit_code == 2 and "syntax error" in bad.output
    assert shell.run("echo still", 10).output == "still\n"


def test_exit_starts_a_new_shell(shell: PersistentBash) -> None:
    out = shell.run("exit 7", 10)
    assert out.exit_code == 7 and "new shell" in out.note
    assert shell.run("echo back", 10).output == "back\n"


def test_stdin_is_empty_so_readers_do_not_hang(shell: PersistentBash) -> None:
    out = shell.run("cat; read x; echo done", 10)
    assert out.output == "done\n" and not out.timed_out


def test_timeout_interrupts_and_keeps_the_shell(shell: PersistentBash) -> None:
    shell.run("cd /tmp && export KEEP=1", 10)
    out = shell.run("sleep 100", 0.5)
    assert out.timed_out and out.exit_code == 130 and "timed out" in out.note
    after = shell.run("pwd; echo $KEEP", 10)
    assert after.output == "/tmp\n1\n" and after.exit_code == 0


def test_sigint_ignoring_command_is_killed(shell: PersistentBash) -> None:
    out = shell.run("trap '' INT; sleep 100; echo after-kill", 0.5)
    assert out.timed_out and "after-kill" in out.output
    assert shell.run("trap - INT; echo ok", 10).output == "ok\n"


def test_output_is_capped_with_marker(shell: PersistentBash) -> None:
    out = shell.run("seq 1 10000", 10)
    assert out.truncated and out.exit_code == 0
    assert out.output.startswith("1\n2\n") and out.output.endswith("9999\n10000\n")
    assert "bytes of output truncated" in out.output and len(out.output) < 1200


def test_endless_output_is_interrupted_at_the_hard_cap(shell: PersistentBash) -> None:
    out = shell.run("yes", 30)
    assert out.truncated and not out.timed_out and "exceeded" in out.note
    assert shell.run("echo fine", 10).output == "fine\n"


_INTERRUPT_WITH_SIGINT_IGNORED = """
import json, os, signal, sys
from pathlib import Path
from workers.toolserver.bash import PersistentBash
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a worker started with `&` from a batch script
root = Path(sys.argv[1])
bash = PersistentBash(root, {"PATH": os.environ["PATH"]}, root / ".state", output_cap=1000, hard_output_cap=100_000)
bash.start()
out = bash.run("sleep 100", 0.5)
print(json.dumps({"code": out.exit_code, "output": out.output}))
bash.close()
"""


def test_timeout_interrupts_even_when_the_server_inherited_sigint_ignored(tmp_path: Path) -> None:
    """bash cannot reset a signal ignored on entry: the shell must not inherit it, or ^C never stops a command."""
    import json
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_WITH_SIGINT_IGNORED, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    outcome = json.loads(result.stdout)
    assert outcome["code"] == 130 and "Killed" not in outcome["output"], outcome
