"""Load held: agent jobs queued deep while locust's clients submit, long-poll and read, with nothing lost.

A stack as `rollouts up` starts it (embedded Redis, the API, init/rollout/eval workers) running the
`agent-answer` kind (tests/support/agent_kinds.py: the real agent loop, LLM turns only, no sandbox) against
stand-in vLLM servers (tests/support/standin_llm.py) that answer a turn in 50-100 ms: a job's 2-4 turns
wait ~0.25 s on the LLM, so a few dozen rollout slots keep up with anything 2 cores can push through the
service, and the CPU goes to the API, the workers and Redis (the stand-in's own share is in the table).
`--queued` jobs are queued first (POSTs of 500), then locust runs headless in a process of its own
(bench/load_locustfile.py; it patches the standard library with gevent): `--users` clients, each looping
submit one job, long-poll it (`GET /v1/jobs?ids=<id>&wait_s=`) to its end, read its record, until
`--client-jobs` jobs are read back. The jobs are test_load's (tests/reliability/test_load.py): scripted
episodes whose reward the bench knows, so every job is checked done once with its reward, through the API.

Reported: locust's p50/p99 per request, jobs done/lost/duplicated, Redis used_memory per job, CPU seconds
per job of each process kind (/proc/<pid>/stat), wall time, jobs/s, the load average. Exits 1 on any
request failure, lost job or wrong reward.

    .venv/bin/python -m bench.load [--queued 10000] [--users 200] [--spawn-rate 20] [--client-jobs 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from redis import Redis

from bench.process_cpu import cpu_seconds
from bench.redis_memory import used_memory
from cli.embedded_redis import free_port
from cli.stack import Stack
from cli.tiny_model import build_tokenizer
from shared.config import Settings
from tests.reliability.jobs import submit
from tests.reliability.test_load import agent_jobs
from tests.support.standin_llm import MARKER, StandinProcess
from tests.support.waiting import TERMINAL

REPO = Path(__file__).resolve().parents[1]
ENV = {"ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds", "ROLLOUTS_LOG_LEVEL": "WARNING"}
CHUNK = 500  # jobs per POST when queueing
LOCUST = Path(sys.executable).with_name("locust")  # the console script beside this interpreter
REQUESTS = ("submit", "poll", "read", "end -> poll answer")


def expected(job: dict[str, Any]) -> tuple[int, float]:
    """A scripted job's (assistant turns, reward), read from its prompt's stand-in marker."""
    found = MARKER.search(job["task"]["problem"])
    assert found is not None, job
    return int(found.group(1)), float(found.group(2) == job["task"]["answer"])


def summaries(api: httpx.Client, ids: list[str], chunk: int = 100) -> dict[str, dict[str, Any]]:
    """id -> summary (status, reward) of every id the API still knows."""
    out: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), chunk):
        response = api.get("/v1/jobs", params={"ids": ",".join(ids[start : start + chunk]), "limit": chunk})
        response.raise_for_status()
        out.update({row["id"]: row for row in response.json()["jobs"]})
    return out


def process_kinds(stack: Stack, standins: list[StandinProcess]) -> dict[str, list[int]]:
    """The pids of each kind of process the run loads (the stack's children, its Redis, the stand-ins)."""
    kinds = {stage: [p.pid for p in procs] for stage, procs in stack.workers.items()}
    assert stack.api is not None and stack.redis is not None and stack.redis.process is not None
    kinds["api"] = [stack.api.pid]
    kinds["redis"] = [stack.redis.process.pid]
    kinds["registrar"] = [p.pid for p in stack.registrars]
    kinds["stand-in"] = [s.process.pid for s in standins]
    return kinds


class Sampler(threading.Thread):
    """The load average every 5 s and a progress line every `every_s`, while the run lasts."""

    def __init__(self, api_url: str, total: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.api = httpx.Client(base_url=api_url, timeout=30.0)
        self.total, self.every_s = total, every_s
        self.loads: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        started = last = time.monotonic()
        while not self.stop.wait(5.0):
            self.loads.append(os.getloadavg()[0])
            if time.monotonic() - last < self.every_s:
                continue
            last = time.monotonic()
            try:
                status = self.api.get("/v1/status").json()
            except (httpx.HTTPError, ValueError) as exc:
                print(f"  {last - started:5.0f} s: /v1/status: {exc!r}", flush=True)
                continue
            queued = "/".join(str(status["stages"][s]["queued"]) for s in ("init", "rollout", "eval"))
            print(
                f"  {last - started:5.0f} s: {status['jobs'].get('done', 0)}/{self.total} done, "
                f"queued init/rollout/eval {queued}, load average {self.loads[-1]:.1f}",
                flush=True,
            )


def run_locust(args: argparse.Namespace, api_url: str, jobs: list[dict[str, Any]], work: Path) -> dict[str, Any]:
    """Locust headless over `jobs`, in a process of its own; its stats, failures, submitted ids and CPU."""
    jobs_file, ids_file, summary = work / "client_jobs.json", work / "client_ids.txt", work / "locust_summary.json"
    jobs_file.write_text(json.dumps(jobs))
    argv = [
        str(LOCUST),
        "-f", str(REPO / "bench" / "load_locustfile.py"),
        "--headless", "--only-summary", "--loglevel", "WARNING",
        "-u", str(args.users), "-r", str(args.spawn_rate), "-H", api_url,
        "-t", f"{args.cap_s:.0f}s", "--csv", str(work / "locust"), "--summary-out", str(summary),
        "--jobs-file", str(jobs_file), "--ids-out", str(ids_file), "--wait-s", f"{args.wait_s:g}",
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with (work / "locust.log").open("wb") as log:
        run = subprocess.run(
            argv, check=False, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=args.cap_s + 120
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ids = [line.split() for line in ids_file.read_text().splitlines()] if ids_file.exists() else []
    return {
        "code": run.returncode,
        **(json.loads(summary.read_text()) if summary.exists() else {"requests": {}, "errors": ["no summary"]}),
        "ids": {int(index): job_id for index, job_id in ids},
        "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "log_tail": (work / "locust.log").read_text(errors="replace")[-3000:],
    }


def wait_ended(api: httpx.Client, total: int, deadline: float) -> None:
    """Until the service counts `total` ended jobs (the status page's counts, not a scan of every id)."""
    while time.monotonic() < deadline:
        jobs = api.get("/v1/status").json()["jobs"]
        if sum(jobs.get(status, 0) for status in TERMINAL) >= total:
            return
        time.sleep(1.0)


def measure(args: argparse.Namespace, stack: Stack, standins: list[StandinProcess], work: Path) -> dict[str, Any]:
    """The run itself: queue, let locust loose, wait for every job, read the counters back."""
    api = httpx.Client(base_url=stack.api_url, timeout=60.0)
    redis = Redis.from_url(stack.redis_url)
    jobs = agent_jobs(args.queued + args.client_jobs)
    total = len(jobs)
    pids = process_kinds(stack, standins)
    cpu_before = {kind: sum(cpu_seconds(pid, children=True) for pid in group) for kind, group in pids.items()}
    memory = {"before": used_memory(redis)}
    sampler = Sampler(stack.api_url, total, args.progress_s)
    sampler.start()
    started = time.perf_counter()
    deadline = time.monotonic() + args.cap_s
    queued_ids = submit(api, jobs[: args.queued], chunk=CHUNK)
    queueing_s = time.perf_counter() - started
    memory["queued"] = used_memory(redis)
    print(f"  {args.queued} jobs queued in {queueing_s:.1f} s; locust: {args.users} users", flush=True)
    clients = run_locust(args, stack.api_url, jobs[args.queued :], work)
    wait_ended(api, total, deadline)
    elapsed = time.perf_counter() - started
    sampler.stop.set()
    sampler.join(timeout=60)
    memory["after"] = used_memory(redis)
    cpu = {
        kind: sum(cpu_seconds(pid, children=True) for pid in group) - cpu_before[kind] for kind, group in pids.items()
    }
    cpu["locust (clients)"] = clients["cpu_s"]
    alive = {kind: all(Path(f"/proc/{pid}").exists() for pid in group) for kind, group in pids.items()}

    by_index = dict(enumerate(queued_ids)) | {args.queued + i: job_id for i, job_id in clients["ids"].items()}
    seen = summaries(api, list(by_index.values()))
    wrong = [
        (index, seen.get(job_id, {}).get("status"), seen.get(job_id, {}).get("reward"))
        for index, job_id in by_index.items()
        if seen.get(job_id, {}).get("status") != "done" or seen[job_id]["reward"] != expected(jobs[index])[1]
    ]
    status = api.get("/v1/status").json()
    pool_inflight = api.get("/v1/backends").json()["inflight"]  # 0: every trajectory released its backend
    turns = sum(expected(jobs[index])[0] for index in by_index)
    api.close()
    redis.close()
    sampler.api.close()
    return {
        "total": total,
        "submitted": len(by_index),
        "distinct": len(set(by_index.values())),
        "done": sum(1 for row in seen.values() if row["status"] == "done"),
        "wrong": wrong,
        "by_status": {name: n for name, n in status["jobs"].items() if n},
        "rq_failed": {stage: counts["failed"] for stage, counts in status["stages"].items() if counts["failed"]},
        "pool_inflight": pool_inflight,
        "served": sum(s.stats()["served"] for s in standins),
        "turns": turns,
        "memory": memory,
        "cpu": cpu,
        "alive": alive,
        "clients": clients,
        "queueing_s": queueing_s,
        "elapsed_s": elapsed,
        "loads": sampler.loads or [os.getloadavg()[0]],
    }


def report(args: argparse.Namespace, r: dict[str, Any]) -> list[str]:
    """Print the tables; the run's errors (empty when the load was held)."""
    clients, stats = r["clients"], r["clients"]["requests"]
    print(f"\n{args.queued} jobs queued, then {args.users} locust users seeing {args.client_jobs} jobs through")
    print("\n| request | count | failures | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in REQUESTS:
        row = stats.get(name)
        if row is not None:
            label = f"{name} (wait_s={args.wait_s:g})" if name == "poll" else name
            print(f"| {label} | {row['count']} | {row['failures']} | {row['p50']} | {row['p99']} | {row['max']:.0f} |")
    jobs = r["submitted"]
    print("\n| process | CPU s | CPU ms per job |")
    print("|---|---:|---:|")
    for kind, seconds in r["cpu"].items():
        print(f"| {kind} | {seconds:.1f} | {seconds * 1000 / max(1, jobs):.2f} |")
    service = sum(s for kind, s in r["cpu"].items() if kind not in ("stand-in", "locust (clients)"))
    print(f"| **service (API, workers, Redis, registrar)** | {service:.1f} | {service * 1000 / max(1, jobs):.2f} |")
    mem = r["memory"]
    lost = jobs - r["done"]
    duplicated = sum(r["by_status"].values()) - jobs + max(0, r["served"] - r["turns"])
    print(
        f"\njobs: {jobs} submitted ({args.queued} queued + {len(clients['ids'])} by the clients), "
        f"{r['done']} done, {lost} lost, {duplicated} duplicated; statuses {r['by_status']}"
    )
    print(f"generations: {r['served']} served = {r['turns']} turns the scripts ask for")
    print(
        f"redis used_memory: {mem['before'] / 2**20:.1f} MiB before, {mem['queued'] / 2**20:.1f} MiB with "
        f"{args.queued} queued, {mem['after'] / 2**20:.1f} MiB at the end; per job "
        f"{(mem['queued'] - mem['before']) / max(1, args.queued):.0f} B queued, "
        f"{(mem['after'] - mem['before']) / max(1, jobs):.0f} B finished"
    )
    loads = r["loads"]
    print(
        f"wall: {r['queueing_s']:.1f} s to queue, {r['elapsed_s']:.0f} s until all done, "
        f"{jobs / r['elapsed_s']:.1f} jobs/s; load average (1 min) {min(loads):.1f}-{max(loads):.1f}, "
        f"mean {sum(loads) / len(loads):.1f}"
    )
    errors = [f"locust: {line}" for line in clients["errors"]]
    if clients["code"] != 0:
        errors.append(f"locust exited {clients['code']}:\n{clients['log_tail']}")
    errors += [f"{len(r['wrong'])} jobs not done with their reward, e.g. {r['wrong'][:5]}"] if r["wrong"] else []
    if len(clients["ids"]) != args.client_jobs or r["distinct"] != jobs or jobs != r["total"]:
        errors.append(f"submitted {jobs} ({r['distinct']} distinct ids) of {r['total']} jobs")
    if lost or duplicated or r["rq_failed"] or r["pool_inflight"]:
        errors.append(
            f"{lost} lost, {duplicated} duplicated, rq failures {r['rq_failed']}, "
            f"{r['pool_inflight']} trajectories still charged in the backend pool"
        )
    errors += [f"{kind} died during the run" for kind, up in r["alive"].items() if not up]
    print(f"errors: {len(errors)}")
    for error in errors:
        print(f"  {error}")
    return errors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10000, help="jobs queued before the clients start")
    parser.add_argument("--users", type=int, default=200, help="locust users (concurrent clients)")
    parser.add_argument("--spawn-rate", type=float, default=20.0, help="users started per second")
    parser.add_argument("--client-jobs", type=int, default=2000, help="jobs the clients see through, in all")
    parser.add_argument("--wait-s", type=float, default=30.0, help="each long poll's wait_s")
    parser.add_argument("--backends", type=int, default=1, help="stand-in LLM servers")
    parser.add_argument("--delay", type=float, nargs=2, default=(0.05, 0.1), metavar=("MIN_S", "MAX_S"))
    parser.add_argument("--rollout-processes", type=int, default=2)
    parser.add_argument("--rollout-slots", type=int, default=32, help="per rollout process")
    parser.add_argument("--init-slots", type=int, default=8)
    parser.add_argument("--eval-slots", type=int, default=8)
    parser.add_argument("--cap-s", type=float, default=3600.0, help="give up on the run after this long")
    parser.add_argument("--progress-s", type=float, default=30.0, help="a progress line this often")
    parser.add_argument("--keep", type=Path, help="keep the run's files (logs, locust's CSVs) in this new directory")
    args = parser.parse_args(argv)
    if not LOCUST.exists():
        raise SystemExit(f"{LOCUST} is missing: locust is in the dev extra (pip install -e '.[dev]')")
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=args.keep is None)
        tokenizer = work / "tokenizer"
        build_tokenizer().save_pretrained(tokenizer)
        standins = [
            StandinProcess(tokenizer, free_port(), tuple(args.delay), work / f"standin-{n}.log", seed=n)
            for n in range(args.backends)
        ]
        stack = Stack(
            Settings(redis_url=None, state_dir=work / "state"),
            api_port=0,
            log_dir=work / "logs",
            concurrency={"init": args.init_slots, "rollout": args.rollout_slots, "eval": args.eval_slots},
            backend_urls=[s.url for s in standins],
            extra_env=ENV,
        )
        try:
            for server in standins:
                server.wait_healthy()
            stack.start()
            for _ in range(args.rollout_processes - 1):
                stack.start_worker("rollout")
            stack.wait_for_workers(timeout=120)
            result = measure(args, stack, standins, work)
        finally:
            stack.stop(timeout=10)
            for server in standins:
                server.stop()
    if report(args, result):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
