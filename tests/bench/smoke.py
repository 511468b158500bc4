"""What the benchmarks' smoke tests share: run a bench's `main` in this process, read what it printed."""

from __future__ import annotations

import importlib
import re

import pytest

NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?"


def run_bench(capsys: pytest.CaptureFixture[str], name: str, *argv: str) -> str:
    """`python -m bench.<name> *argv`, in process: its stdout. A bench that no longer runs fails here.
    The report is printed again, so `pytest -rP` shows it."""
    capsys.readouterr()
    importlib.import_module(f"bench.{name}").main(list(argv))
    out = capsys.readouterr().out
    print(out)
    return out


def lines_with(out: str, pattern: str) -> list[str]:
    """The report's lines matching `pattern` (a regex; `{n}` stands for a number); at least one."""
    regex = re.compile(pattern.replace("{n}", NUMBER))
    found = [line for line in out.splitlines() if regex.search(line)]
    assert found, f"no line matches {pattern!r} in:\n{out}"
    return found


def skip_without_bwrap() -> None:
    """The sandbox benchmarks measure bubblewrap sandboxes (isolation required): nothing to measure without it."""
    from workers.sandbox.local import bwrap_usable

    usable, reason = bwrap_usable()
    if not usable:
        pytest.skip(f"bubblewrap cannot run here: {reason}")
