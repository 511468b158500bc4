"""A process's CPU time so far, read from /proc: how the benchmarks charge CPU to the process that spent it."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU of `pid` (with `children`: and of its reaped children too); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(value) for value in fields[11 : 15 if children else 13]) / TICK  # utime stime [cutime cstime]
