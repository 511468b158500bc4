"""Processes as /proc shows them, for fault tests that find a process to kill by its place in the tree."""

from __future__ import annotations

import os
from pathlib import Path


def process_table() -> dict[int, tuple[int, int]]:
    """Every live process: pid -> (parent pid, process group); one that exits while it is read is left out."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry)] = (int(stat[1]), int(stat[2]))
    return table
