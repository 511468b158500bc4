"""Tool round trips: persistent pty bash vs tmux polling vs ``bash -c``; IPython over ipc vs tcp
vs a new ``python -c``; sandbox start and stop.

Every variant runs the same trivial command (``true``; ``1+1``) so the figure is the
mechanism's own overhead. The sandboxed figures go through the whole path the rollout
worker uses (msgpack frame over the Unix socket into a bubblewrap sandbox).

    .venv/bin/python -m bench.tools [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from shared.config import Settings
from shared.sandbox import SandboxSpec, create_sandbox
from shared.sandbox.local import bwrap_usable
from shared.toolserver.bash import PersistentBash
from shared.toolserver.python import PythonKernel


def measure(fn: Callable[[], object], calls: int, warmup: int = 3) -> tuple[float, float]:
    """(p50, p99) latency in milliseconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


class TmuxShell:
    """The older approach: send-keys into a tmux pane, poll capture-pane for a done marker."""

    def __init__(self, poll_s: float) -> None:
        self.session = f"bench-{uuid.uuid4().hex[:8]}"
        self.poll_s = poll_s
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", self.session, "-x", "200", "-y", "50", "bash --norc"], check=True
        )
        self.count = 0

    def run(self, command: str) -> str:
        self.count += 1
        marker = f"__DONE_{self.count}__"
        subprocess.run(["tmux", "send-keys", "-t", self.session, f"{command}; echo {marker}", "Enter"], check=True)
        while True:
            pane = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", self.session], capture_output=True, text=True, check=True
            ).stdout
            if f"\n{marker}" in pane:
                subprocess.run(["tmux", "clear-history", "-t", self.session], check=True)
                subprocess.run(["tmux", "send-keys", "-t", self.session, "clear", "Enter"], check=True)
                return pane
            if self.poll_s:
                time.sleep(self.poll_s)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.session], check=False)


def row(name: str, p50: float, p99: float, base: float | None) -> str:
    ratio = f"{p50 / base:.1f}x" if base else "1.0x"
    return f"| {name} | {p50:.2f} | {p99:.2f} | {ratio} |"


def bench_bash(calls: int, settings: Settings, work: Path) -> list[str]:
    lines = ["| bash `true` round trip | p50 ms | p99 ms | vs persistent (sandboxed) |", "|---|---|---|---|"]
    (work / "ws").mkdir()
    with create_sandbox(SandboxSpec(), work / "ws", work / "rt", settings) as box:
        base, p99 = measure(lambda: box.call("bash", {"command": "true"}), calls)
    lines.append(row("persistent pty bash, sandboxed, via Unix socket", base, p99, None))
    shell = PersistentBash(work, {"PATH": os.environ["PATH"]}, work / "st", 16384, 1 << 20)
    shell.start()
    p50, p99 = measure(lambda: shell.run("true", 10), calls)
    shell.close()
    lines.append(row("persistent pty bash, in process (no socket)", p50, p99, base))
    if shutil.which("tmux"):
        for poll in (0.0, 0.05):
            tmux = TmuxShell(poll)
            try:
                p50, p99 = measure(lambda tmux=tmux: tmux.run("true"), max(calls // 4, 20))
            finally:
                tmux.close()
            label = "busy polling" if poll == 0 else f"{poll * 1000:.0f} ms poll interval"
            lines.append(row(f"tmux send-keys + capture-pane, {label}", p50, p99, base))
    else:
        lines.append("| tmux (not installed: skipped) | - | - | - |")
    p50, p99 = measure(lambda: subprocess.run(["bash", "-c", "true"], check=True), calls)
    lines.append(row("new `bash -c` per call (unsandboxed)", p50, p99, base))
    box2 = create_sandbox(SandboxSpec(), work / "ws", work / "rt2", settings)
    p50, p99 = measure(lambda: box2.exec(["true"], timeout=30), max(calls // 4, 20))
    box2.stop()
    lines.append(row("new sandboxed process per call (`Sandbox.exec`)", p50, p99, base))
    return lines


def bench_python(calls: int, settings: Settings, work: Path) -> list[str]:
    lines = ["| IPython `1+1` round trip | p50 ms | p99 ms | vs ipc kernel (sandboxed) |", "|---|---|---|---|"]
    with create_sandbox(SandboxSpec(), work / "ws", work / "rt3", settings) as box:
        box.call("python", {"code": "0"})
        base, p99 = measure(lambda: box.call("python", {"code": "1+1"}), calls)
    lines.append(row("persistent kernel, ipc, sandboxed, via Unix socket", base, p99, None))
    env = {"PATH": os.environ["PATH"], "HOME": str(work)}
    for transport in ("ipc", "tcp"):
        kernel = PythonKernel(work, env, work / f"k-{transport}", transport=transport)
        kernel.start()
        p50, p99 = measure(lambda kernel=kernel: kernel.run("1+1", 30), calls)
        kernel.close()
        lines.append(row(f"persistent kernel, {transport}, in process", p50, p99, base))
    fresh = [sys.executable, "-c", "print(1+1)"]
    p50, p99 = measure(lambda: subprocess.run(fresh, check=True, capture_output=True), max(calls // 4, 20))
    lines.append(row("new `python -c` per call (unsandboxed)", p50, p99, base))
    box2 = create_sandbox(SandboxSpec(), work / "ws", work / "rt4", settings)
    p50, p99 = measure(lambda: box2.exec(fresh, timeout=30), max(calls // 4, 20))
    box2.stop()
    lines.append(row("new sandboxed `python -c` per call (`Sandbox.exec`)", p50, p99, base))
    return lines


def bench_lifecycle(rounds: int, settings: Settings, work: Path) -> list[str]:
    starts, firsts, stops = [], [], []
    (work / "ws-life").mkdir()
    for index in range(rounds):
        box = create_sandbox(SandboxSpec(), work / "ws-life", work / f"life{index}", settings)
        t0 = time.perf_counter()
        box.start()
        t1 = time.perf_counter()
        box.call("python", {"code": "1+1"})
        t2 = time.perf_counter()
        box.stop()
        t3 = time.perf_counter()
        starts.append((t1 - t0) * 1000)
        firsts.append((t2 - t1) * 1000)
        stops.append((t3 - t2) * 1000)
    med = statistics.median
    return [
        "| sandbox lifecycle (bubblewrap) | median ms |",
        "|---|---|",
        f"| start (bwrap + tool server + shell, until it answers) | {med(starts):.0f} |",
        f"| first `python` call (kernel starts lazily) | {med(firsts):.0f} |",
        f"| stop (every process gone, runtime dir removed) | {med(stops):.0f} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    usable, reason = bwrap_usable()
    if not usable:
        raise SystemExit(f"bubblewrap cannot run here: {reason}")
    work = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    settings = Settings(state_dir=work / "state")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n", flush=True)
    try:
        for section in (
            bench_bash(args.calls, settings, work),
            bench_python(args.calls, settings, work),
            bench_lifecycle(args.rounds, settings, work),
        ):
            print("\n".join(section) + "\n", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
