"""Cost of the sandbox disk quota's walk (workers/sandbox/quota.py) against `du -s` on the same tree.

Builds a tree shaped like a SWE workspace (--dirs directories of --files files of a few KB each),
then times, side by side in one process and alternating, `disk_usage([tree])` and coreutils'
`du -s` over it (--rounds each; the page cache is warm for both). Prints the medians, the ratio,
and what the watch's pacing makes of it: the wait between walks (at least `WALK_PACING` x a walk)
and the share of one core one watched sandbox costs.

    .venv/bin/python -m bench.disk_quota [--dirs 300] [--files 20] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from shared.config import Settings
from workers.sandbox.quota import WALK_PACING, disk_usage


def build_tree(root: Path, dirs: int, files: int) -> int:
    """`dirs` x `files` small files (1-8 KB), nested two deep; returns the entry count."""
    for d in range(dirs):
        folder = root / f"pkg{d % 17}" / f"mod{d}"
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(files):
            (folder / f"f{f}.py").write_bytes(b"x" * (1024 * (1 + (d + f) % 8)))
    return sum(len(dirnames) + len(filenames) for _, dirnames, filenames in os.walk(root))


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirs", type=int, default=300)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-quota-"))
    try:
        entries = build_tree(root, args.dirs, args.files)
        walk, du = [], []
        for _ in range(args.rounds):
            walk.append(timed(lambda: disk_usage([root])))
            du.append(timed(lambda: subprocess.run(["du", "-s", str(root)], check=True, capture_output=True)))
        ours, base = statistics.median(walk), statistics.median(du)
        interval = Settings().sandbox_disk_check_interval_s
        wait = max(interval, WALK_PACING * ours)
        print(f"tree: {entries} entries, {disk_usage([root]).bytes >> 20} MiB on disk")
        print(
            f"disk_usage walk median {ours * 1000:.1f} ms; du -s median {base * 1000:.1f} ms; ratio {ours / base:.2f}"
        )
        print(
            f"watch: a walk every {wait:.2f} s (interval {interval} s, pacing {WALK_PACING:g}x): "
            f"{100 * ours / (ours + wait):.1f}% of a core per watched sandbox"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
