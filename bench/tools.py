"""Tool round trips: persistent pty bash vs tmux polling vs ``bash -c``; IPython over ipc vs tcp
vs a new ``python -c``; sandbox start and stop; a kernel's start, fresh vs forked; a kernel's death.

Every variant runs the same trivial command (``true``; ``1+1``) so the figure is the
mechanism's own overhead. The sandboxed figures go through the whole path the rollout
worker uses (msgpack frame over the Unix socket into a bubblewrap sandbox).

The variants of a table run interleaved (each round calls every variant once, in a
shuffled order) so that a shared, loaded host slows them alike and the ratios stay fair.
Both "new process per call" baselines spawn the same way (``subprocess.run`` with output
captured, as a tool would need it; ``Sandbox.exec`` in the sandbox).

    .venv/bin/python -m bench.tools [--calls 300]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.process_cpu import cpu_seconds
from shared.config import Settings
from workers.sandbox import SandboxSpec, create_sandbox
from workers.sandbox.local import bwrap_usable
from workers.toolserver.bash import PersistentBash
from workers.toolserver.kernel_forks import KERNEL_SCRIPT
from workers.toolserver.python import PythonKernel

Stats = tuple[float, float, float]  # p50, mean, p99 in ms


def interleaved(variants: dict[str, Callable[[], object]], rounds: int, warmup: int = 5) -> dict[str, Stats]:
    """(p50, mean, p99) per variant in ms; each round calls every variant once, in a shuffled order."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for _ in range(rounds):
        random.shuffle(names)
        for name in names:
            started = time.perf_counter()
            variants[name]()
            samples[name].append((time.perf_counter() - started) * 1000)
    stats = {}
    for name, values in samples.items():
        values.sort()
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        stats[name] = (statistics.median(values), statistics.mean(values), p99)
    return stats


def spawn(argv: list[str]) -> None:
    """The unsandboxed "new process per call" path, the same for bash and python."""
    subprocess.run(argv, check=True, capture_output=True)


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


def table(title: str, base_name: str, stats: dict[str, Stats], baselines: dict[str, str]) -> list[str]:
    """Rows with p50, mean, p99; the ratio to ``base_name``; and how many times faster than each baseline.

    ``baselines`` maps a row name to its short column label; ratios are the baseline's over the row's.
    """
    base = stats[base_name][0]
    head = f"| {title} | p50 ms | mean ms | p99 ms | p50 vs first row |"
    head += "".join(f" {label} / this, p50 (mean) |" for label in baselines.values())
    lines = [head, "|" + "---|" * (5 + len(baselines))]
    for name, (p50, mean, p99) in stats.items():
        line = f"| {name} | {p50:.2f} | {mean:.2f} | {p99:.2f} | {p50 / base:.1f}x |"
        line += "".join(f" {stats[b][0] / p50:.1f}x ({stats[b][1] / mean:.1f}x) |" for b in baselines)
        lines.append(line)
    return lines


STOCK_LAUNCHER = ["-m", "ipykernel_launcher"]


class StockKernel:
    """The way this tool used to drive IPython: ``ipykernel_launcher`` and jupyter_client's blocking client.

    Kept here as the reference the python tool's kernel and client are measured against. With
    ``launcher=[kernel.py]`` it is how the tool started its own kernel before the fork server: a
    fresh interpreter under jupyter_client's KernelManager.
    """

    def __init__(self, work: Path, env: dict[str, str], launcher: list[str] = STOCK_LAUNCHER) -> None:
        from jupyter_client import KernelManager

        self.manager = KernelManager(transport="ipc", ip=str(work / "k"), connection_file=str(work / "kernel.json"))
        self.manager.kernel_spec.argv = [sys.executable, *launcher, "-f", "{connection_file}"]
        self.manager.start_kernel(
            cwd=str(work),
            env={**env, "IPYTHONDIR": str(work / "ipython")},
            extra_arguments=["--HistoryManager.enabled=False", "--colors=NoColor"],
        )
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str) -> None:
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False)
        while True:
            msg = self.client.get_iopub_msg(timeout=30)
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                break
        self.client.get_shell_msg(timeout=30)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


_PIPE_REPL = """
import io, json, os, struct, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance(colors="NoColor")
shell.history_manager.enabled = False
def read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data
while True:
    code = read(struct.unpack("<I", read(4))[0]).decode()
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        result = shell.run_cell(code, store_history=False).result
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    reply = json.dumps([out.getvalue(), err.getvalue(), None if result is None else repr(result)]).encode()
    os.write(1, struct.pack("<I", len(reply)) + reply)
"""


class PipeRepl:
    """A single-threaded IPython REPL over a pipe: a reference for what the Jupyter architecture costs.

    Not the tool (no streaming, interrupts, fd capture or protocol): one process, no
    threads, one wake-up each way, so its round trip is IPython's ``run_cell`` plus a pipe.
    """

    def __init__(self) -> None:
        argv = [sys.executable, "-c", _PIPE_REPL]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, code: str) -> str | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        data = code.encode()
        os.write(self.proc.stdin.fileno(), struct.pack("<I", len(data)) + data)
        size = struct.unpack("<I", self.proc.stdout.read(4))[0]
        return json.loads(self.proc.stdout.read(size))[2]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def bench_bash(calls: int, settings: Settings, work: Path) -> list[str]:
    (work / "ws").mkdir()
    base = "persistent pty bash, sandboxed, via Unix socket"
    fresh, fresh_boxed = "new `bash -c` per call (unsandboxed)", "new sandboxed process per call (`Sandbox.exec`)"
    box = create_sandbox(SandboxSpec(), work / "ws", work / "rt", settings).start()
    box2 = create_sandbox(SandboxSpec(), work / "ws", work / "rt2", settings)  # exec needs no tool server
    shell = PersistentBash(work, {"PATH": os.environ["PATH"]}, work / "st", 16384, 1 << 20)
    shell.start()
    tmuxes = [TmuxShell(poll) for poll in (0.0, 0.05)] if shutil.which("tmux") else []
    variants: dict[str, Callable[[], object]] = {
        base: lambda: box.call("bash", {"command": "true"}),
        "persistent pty bash, in process (no socket)": lambda: shell.run("true", 10),
    }
    for tmux in tmuxes:
        label = "busy polling" if tmux.poll_s == 0 else f"{tmux.poll_s * 1000:.0f} ms poll interval"
        variants[f"tmux send-keys + capture-pane, {label}"] = lambda tmux=tmux: tmux.run("true")
    variants[fresh] = lambda: spawn(["bash", "-c", "true"])
    variants[fresh_boxed] = lambda: box2.exec(["true"], timeout=30)
    try:
        stats = interleaved(variants, calls)
    finally:
        for tmux in tmuxes:
            tmux.close()
        shell.close()
        box.stop()
        box2.stop()
    lines = table("bash `true` round trip", base, stats, {fresh: "`bash -c`", fresh_boxed: "sandboxed"})
    if not tmuxes:
        lines.append("| tmux (not installed: skipped) | - | - | - | - | - | - |")
    return lines


def bench_python(calls: int, settings: Settings, work: Path) -> list[str]:
    base = "persistent kernel, ipc, sandboxed, via Unix socket"
    fresh = "new `python -c` per call (unsandboxed)"
    fresh_boxed = "new sandboxed `python -c` per call (`Sandbox.exec`)"
    box = create_sandbox(SandboxSpec(), work / "ws", work / "rt3", settings).start()
    box.call("python", {"code": "0"})
    box2 = create_sandbox(SandboxSpec(), work / "ws", work / "rt4", settings)  # exec needs no tool server
    env = {"PATH": os.environ["PATH"], "HOME": str(work)}
    kernels = {}
    for transport in ("ipc", "tcp"):
        kernels[transport] = PythonKernel(work, env, work / f"k-{transport}", transport=transport)
        kernels[transport].start()
    (work / "k-stock").mkdir()
    stock = StockKernel(work / "k-stock", env)
    repl = PipeRepl()
    argv = [sys.executable, "-c", "print(1+1)"]
    variants: dict[str, Callable[[], object]] = {
        base: lambda: box.call("python", {"code": "1+1"}),
        "persistent kernel, ipc, in process": lambda: kernels["ipc"].run("1+1", 30),
        "persistent kernel, tcp, in process": lambda: kernels["tcp"].run("1+1", 30),
        "stock ipykernel + jupyter_client blocking client, ipc, in process": lambda: stock.run("1+1"),
        "reference: single-threaded IPython REPL over a pipe (not Jupyter)": lambda: repl.run("1+1"),
        fresh: lambda: spawn(argv),
        fresh_boxed: lambda: box2.exec(argv, timeout=30),
    }
    try:
        stats = interleaved(variants, calls)
    finally:
        repl.close()
        stock.close()
        for kernel in kernels.values():
            kernel.close()
        box.stop()
        box2.stop()
    return table("IPython `1+1` round trip", base, stats, {fresh: "`python -c`", fresh_boxed: "sandboxed"})


def wakeups(pid: int) -> int:
    """Voluntary context switches so far, over every thread of process ``pid``: how often it slept and woke."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
        except OSError:  # a thread that ended meanwhile
            pass
    return total


def bench_wakeups(calls: int, work: Path) -> list[str]:
    """Thread wake-ups per ``1+1``, kernel and client side: a count that load does not inflate."""
    env = {"PATH": os.environ["PATH"], "HOME": str(work)}
    (work / "w-stock").mkdir()
    stock = StockKernel(work / "w-stock", env)
    ours = PythonKernel(work, env, work / "w-ours")
    ours.start()
    assert ours.pid is not None
    stock_pid = stock.manager.provisioner.process.pid  # type: ignore[union-attr]
    ours_pid = ours.pid
    rows = []
    for name, fn, pid in (
        ("stock ipykernel + jupyter_client blocking client", lambda: stock.run("1+1"), stock_pid),
        ("the python tool's kernel and client", lambda: ours.run("1+1", 30), ours_pid),
    ):
        for _ in range(10):
            fn()
        kernel0, client0 = wakeups(pid), wakeups(os.getpid())
        for _ in range(calls):
            fn()
        kernel, client = (wakeups(pid) - kernel0) / calls, (wakeups(os.getpid()) - client0) / calls
        rows.append(f"| {name} | {kernel:.1f} | {client:.1f} |")
    stock.close()
    ours.close()
    return ["| thread wake-ups per `1+1` (in process, ipc) | kernel | client |", "|---|---|---|", *rows]


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


def bench_kernel_starts(rounds: int, work: Path) -> list[str]:
    """A kernel's start until it answers: a fresh interpreter under KernelManager (before) vs the
    sandbox's fork server (its first kernel, which starts the fork server, and every later one);
    wall time and CPU (the tool server's side, the kernel's, the fork server's), rounds interleaved."""
    env = {"PATH": os.environ["PATH"], "HOME": str(work)}
    script = str(KERNEL_SCRIPT)
    rows: dict[str, list[tuple[float, float, float]]] = {
        "fresh interpreter (kernel.py under KernelManager: before)": [],
        "first kernel of a sandbox (starts the fork server)": [],
        "a later kernel (a fork: restarts, a reused sandbox's next job)": [],
    }
    names = list(rows)

    def fresh(index: int) -> None:
        (work / f"fresh{index}").mkdir()
        cpu0, t0 = time.process_time(), time.perf_counter()
        kernel = StockKernel(work / f"fresh{index}", env, launcher=[script])
        wall, client = time.perf_counter() - t0, time.process_time() - cpu0
        rows[names[0]].append((wall, client, cpu_seconds(kernel.manager.provisioner.process.pid)))  # type: ignore[union-attr]
        kernel.close()

    def forked(index: int) -> None:
        kernel = PythonKernel(work, env, work / f"forked{index}")
        for name in names[1:]:
            cpu0, t0 = time.process_time(), time.perf_counter()
            kernel.start()
            wall, client = time.perf_counter() - t0, time.process_time() - cpu0
            assert kernel.pid is not None and kernel.forks.proc is not None
            server = cpu_seconds(kernel.forks.proc.pid) if name == names[1] else 0.0
            rows[name].append((wall, client, cpu_seconds(kernel.pid) + server))
            kernel.close_kernel()
        kernel.close()

    for index in range(rounds):
        for variant in random.sample([fresh, forked], 2):
            variant(index)
    med = statistics.median
    base = med(w for w, _, _ in rows[names[0]]), med(c + k for _, c, k in rows[names[0]])
    lines = [
        "| kernel start, until it answers | wall ms, median | CPU ms: tool server side | CPU ms: kernel"
        " (+ fork server) | before / this: wall, CPU |",
        "|---|---|---|---|---|",
    ]
    for name, samples in rows.items():
        wall, client, kernel = (med(column) for column in zip(*samples, strict=True))
        cpu = med(c + k for _, c, k in samples)
        lines.append(
            f"| {name} | {wall * 1000:.0f} | {client * 1000:.0f} | {kernel * 1000:.0f} |"
            f" {base[0] / wall:.1f}x, {base[1] / cpu:.1f}x |"
        )
    return lines


KILLERS = {
    "the cell calls os._exit(1)": "import os; os._exit(1)",
    "the cell SIGKILLs its kernel after 0.2 s (the OOM killer)": (
        "import os, signal, time; time.sleep(0.2); os.kill(os.getpid(), signal.SIGKILL)"
    ),
}


def bench_kernel_deaths(rounds: int, work: Path) -> list[str]:
    """A call whose kernel dies: how long until the agent has the error observation (the death seen, a new
    kernel started and answering), and the next call."""
    env = {"PATH": os.environ["PATH"], "HOME": str(work)}
    kernel = PythonKernel(work, env, work / "deaths")
    kernel.start()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in KILLERS}
    try:
        for _ in range(rounds):
            for name in random.sample(list(KILLERS), len(KILLERS)):
                t0 = time.perf_counter()
                died = kernel.run(KILLERS[name], 30)
                t1 = time.perf_counter()
                after = kernel.run("1+1", 30)
                t2 = time.perf_counter()
                assert died.died and after.result == "2", (died, after)
                times[name].append(((t1 - t0) * 1000, (t2 - t1) * 1000))
    finally:
        kernel.close()
    med = statistics.median
    return [
        "| a call whose kernel dies | error observation, median ms | the next call, median ms |",
        "|---|---|---|",
        *(f"| {name} | {med(d for d, _ in t):.0f} | {med(n for _, n in t):.0f} |" for name, t in times.items()),
    ]


def bench_server_imports(rounds: int) -> list[str]:
    """The tool server's start-up imports, as it is (jupyter_client when the first python call
    starts the kernel) vs importing jupyter_client and zmq up front, as it did: interleaved."""
    variants = {
        "tool server imports (jupyter_client on the first python call)": "import workers.toolserver.server",
        "the same, jupyter_client and zmq imported up front": "import zmq, jupyter_client, workers.toolserver.server",
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name in random.sample(list(variants), len(variants)):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", variants[name]], check=True)
            times[name].append((time.perf_counter() - t0) * 1000)
    eager = statistics.median(times["the same, jupyter_client and zmq imported up front"])
    return [
        "| new interpreter + imports | median ms | up-front / this |",
        "|---|---|---|",
        *(
            f"| {name} | {statistics.median(t):.0f} | {eager / statistics.median(t):.2f}x |"
            for name, t in times.items()
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="interleaved rounds per table")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--only", default="bash,python,wakeups,lifecycle,kernels,deaths,imports", help="comma-separated sections to run"
    )
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    usable, reason = bwrap_usable()
    if not usable:
        raise SystemExit(f"bubblewrap cannot run here: {reason}")
    work = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    settings = Settings(state_dir=work / "state")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n", flush=True)
    try:
        sections: dict[str, Callable[[], list[str]]] = {
            "bash": lambda: bench_bash(args.calls, settings, work),
            "python": lambda: bench_python(args.calls, settings, work),
            "wakeups": lambda: bench_wakeups(args.calls, work),
            "lifecycle": lambda: bench_lifecycle(args.rounds, settings, work),
            "kernels": lambda: bench_kernel_starts(args.rounds * 2, work),
            "deaths": lambda: bench_kernel_deaths(args.rounds, work),
            "imports": lambda: bench_server_imports(args.rounds * 3),
        }
        for name, section in sections.items():
            if name in only:
                print("\n".join(section()) + "\n", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
