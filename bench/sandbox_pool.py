"""Time from the rollout stage taking a job to its first tool result: cold start vs the warm pool.

For each mode, side by side in one run, and each concurrency C (--concurrency, default 1 8 32):
waves of C jobs of a code task start at once; each job does what the rollout stage does
(``open_job_sandbox``: take a ready sandbox from the pool or start one, under the start cap),
then its first tool call, ``python`` running the starter solution, and ends its sandbox.

- ``cold``: no pool; each job starts its own sandbox, and its first ``python`` call starts the kernel.
- ``single-use``: the pool (kernel started ahead) had refilled before the wave; used sandboxes are stopped.
- ``reuse``: the same, with used sandboxes reset, proven clean and handed back (their kernels restarted).

Prints p50/p99 of the time to the first tool result and of the hand-off alone (taking the
sandbox, the job's files moved in), then the start cap's sweep (--caps): a burst of --burst
cold starts at each cap, starts/s and the p50 time a start took, waiting included.

    .venv/bin/python -m bench.sandbox_pool [--concurrency 1 8 32] [--jobs 32] [--caps 1 2 4 8] [--burst 16]
        [--memory 4]

Last, the memory of --memory ready sandboxes (PSS summed over each one's processes), which is
what ``sandbox_pool_sandbox_bytes`` should be.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from shared.config import Settings
from workers.rollout.job_sandbox import open_job_sandbox
from workers.sandbox import SandboxSpec
from workers.sandbox.pool import SandboxPool
from workers.sandbox.pool_sizing import Demand
from workers.sandbox.profile import SandboxProfile
from workers.sandbox.start_gate import reset_start_gate, start_gate
from workers.toolserver.reaper import descendants

STARTER = "def solve(n):\n    return sum(range(n))\n"
FIRST_CALL = "exec(open('solution.py').read()); solve(10)"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_wave(
    settings: Settings, pool: SandboxPool | None, lifetime: str, size: int, wave: int
) -> list[tuple[float, float]]:
    """``size`` jobs at once; each (first tool result, hand-off) in seconds from taking the job."""
    results: list[tuple[float, float]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    go = threading.Event()

    def job(index: int) -> None:
        ws = settings.workspaces / f"w{wave}-{index}"
        ws.mkdir(parents=True)
        (ws / "solution.py").write_text(STARTER)
        go.wait()
        try:
            taken = time.perf_counter()
            held = open_job_sandbox(SandboxSpec(), ws, settings, python=True, lifetime=lifetime, pool=pool)
            handed = time.perf_counter()
            try:
                result = held.sandbox.call("python", {"code": FIRST_CALL})
                first = time.perf_counter()
                assert result.output == "45\n", result.output
            finally:
                held.finish()
            with lock:
                results.append((first - taken, handed - taken))
        except BaseException as exc:  # noqa: BLE001 - reported after the wave
            errors.append(exc)
        finally:
            shutil.rmtree(ws, ignore_errors=True)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(size)]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def measure(settings: Settings, mode: str, size: int, jobs: int) -> list[tuple[float, float]]:
    pool = None
    if mode != "cold":
        pool = SandboxPool(settings, lambda: Demand(free_slots=size, queue_depth=size))
        profile = SandboxProfile.of(SandboxSpec(), settings, python=True)
        pool.take(profile)  # the profile's first job teaches the pool (it would start cold)
    lifetime = "reuse" if mode == "reuse" else "single-use"
    samples: list[tuple[float, float]] = []
    try:
        for wave in range(max(1, jobs // size)):
            if pool is not None and not pool.wait_ready(profile, size, timeout=600):
                raise RuntimeError(f"the pool did not refill to {size}: {pool.stats}")
            samples += run_wave(settings, pool, lifetime, size, wave)
    finally:
        if pool is not None:
            print(f"    {mode} C={size}: {pool.stats}")
            pool.close()
    return samples


def cap_sweep(settings: Settings, caps: list[int], burst: int) -> None:
    print(f"\nstart cap: a burst of {burst} cold starts (bwrap + tool server + shell), per cap")
    print("| cap | burst wall s | starts/s | p50 start incl. wait, ms | p99 ms |")
    print("|---|---|---|---|---|")
    for cap in caps:
        caps_to = {"sandbox_start_concurrency": cap, "sandbox_start_concurrency_per_image": cap}
        capped = settings.model_copy(update=caps_to)
        reset_start_gate()
        start_gate(capped)
        took: list[float] = []
        lock = threading.Lock()
        began = time.perf_counter()

        def one(
            index: int, capped: Settings = capped, cap: int = cap, lock: threading.Lock = lock, took: list[float] = took
        ) -> None:
            ws = capped.workspaces / f"cap{cap}-{index}"
            ws.mkdir(parents=True)
            t0 = time.perf_counter()
            held = open_job_sandbox(SandboxSpec(), ws, capped, python=False, lifetime="single-use", pool=None)
            with lock:
                took.append(time.perf_counter() - t0)
            held.finish()
            shutil.rmtree(ws, ignore_errors=True)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(burst)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - began
        print(
            f"| {cap} | {wall:.2f} | {burst / wall:.1f} | {statistics.median(took) * 1000:.0f} | "
            f"{pct(took, 0.99) * 1000:.0f} |"
        )
    reset_start_gate()


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_per_sandbox(settings: Settings, count: int) -> None:
    """PSS of every process of a ready sandbox (launcher, tool server, shell, kernel), ``count`` of them at once."""
    pool = SandboxPool(settings, lambda: Demand(free_slots=count, queue_depth=count))
    profile = SandboxProfile.of(SandboxSpec(), settings, python=True)
    pool.take(profile)
    try:
        if not pool.wait_ready(profile, count, timeout=600):
            raise RuntimeError(f"the pool did not fill: {pool.stats}")
        per_box = []
        for box in pool.ready(profile):
            tree = [box.launcher_pid or 0, *descendants(box.launcher_pid or 0)]
            per_box.append(sum(_pss_kib(pid) for pid in tree) / 1024)
        print(
            f"\nmemory of a ready sandbox (kernel started), PSS over its processes, {count} ready at once: "
            f"median {statistics.median(per_box):.0f} MiB, max {max(per_box):.0f} MiB"
        )
    finally:
        pool.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32])
    parser.add_argument("--jobs", type=int, default=32, help="jobs per mode and concurrency (in waves of C)")
    parser.add_argument("--modes", nargs="+", default=["cold", "single-use", "reuse"])
    parser.add_argument("--caps", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--burst", type=int, default=16)
    parser.add_argument("--memory", type=int, default=4, help="ready sandboxes to measure the memory of (0: skip)")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bpool-"))
    biggest = max(args.concurrency or [args.memory])
    settings = Settings(
        state_dir=base / "st",
        sandbox_require_isolation=True,
        sandbox_pool_interval_s=0.2,
        sandbox_pool_memory_bytes=(biggest + 1) * Settings().sandbox_pool_sandbox_bytes,  # room for a whole wave
    )
    try:
        rows = []
        for size in args.concurrency:
            for mode in args.modes:
                samples = measure(settings, mode, size, args.jobs)
                first = [s[0] for s in samples]
                hand = [s[1] for s in samples]
                rows.append((mode, size, len(samples), first, hand))
        if rows:
            print("\n| mode | concurrent jobs | jobs | first tool result p50 ms | p99 ms | hand-off p50 ms | p99 ms |")
            print("|---|---|---|---|---|---|---|")
        for mode, size, count, first, hand in rows:
            figures = [statistics.median(first), pct(first, 0.99), statistics.median(hand), pct(hand, 0.99)]
            print(f"| {mode} | {size} | {count} | " + " | ".join(f"{value * 1000:.1f}" for value in figures) + " |")
        if args.caps:
            cap_sweep(settings, args.caps, args.burst)
        if args.memory:
            memory_per_sandbox(settings, args.memory)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
