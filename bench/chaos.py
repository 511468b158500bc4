"""Two hours of chaos (issue 47 item 7): a steady stream of mixed jobs while a random process is SIGKILLed every few minutes.

One stack, started as `rollouts up --host <this node's address>` starts it: the embedded Redis on its
append-only file, the API, one worker process per stage, the embedded vLLM server on the tiny model
behind a node gateway (its registrar, `rollouts register --gateway`), supervised on the main thread. A
trainer-like client (rollouts_client's RolloutClient, retrying, every submission under an
Idempotency-Key) keeps `--in-flight` jobs from examples/mixed.jsonl (math, STEM, code, SWE) running
and follows them with the service's long poll. Every `--every` seconds (± a third, seeded) one
process is SIGKILLed, the kinds taken in shuffled rounds so each is hit as often: each worker stage,
vLLM's engine (`VLLM::EngineCore`) and API server, the service's API, the embedded Redis, the gateway.
After each kill the run waits until the victim serves again (the time is reported) before the next.

At the end the stream stops, every job is followed to its end, and the run checks: every job ended
(nothing lost) and how; nothing twice, read in Redis itself: every job id it holds is one the client was
given (a submission taken twice would not be), every end it publishes is a job's first. Per
`--window` seconds: jobs ended per second, p50/p99/max of the jobs' time from submission to end, and
Redis' used_memory (finished records expire after `--job-ttl`, the steady state a long run reaches
with a shorter `job_ttl_s` than the default week); a plot with the kills marked. Progress goes to
`--out`/chaos.jsonl as the run goes, so a cut run still has its figures.

    .venv/bin/python -m bench.chaos [--hours 2] [--every 180] [--in-flight 32] [--out DIR]

With `--backend-url URL` the stack uses a vLLM server that already runs, and only kinds that leave it
alone may be chosen (`--kinds init,rollout,eval,api,redis`): the make-test smoke case runs that way.
A measurement, not a test: it imports the tests' tiny model, as bench.stack_faults does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import httpx
from redis import Redis
from redis.exceptions import RedisError

from bench.backends import add_backend_option
from bench.redis_memory import used_memory
from bench.stack_faults import Run, mixed_rows, serving_again, victim, wait
from rollouts_client import RolloutClient
from rollouts_client.errors import ApiError
from rollouts_client.wire import RetryPolicy
from shared.config import Settings
from shared.jobs.status import ALL_STATUSES
from shared.keys import Keys

STAGES = ("init", "rollout", "eval")
KINDS = (*STAGES, "engine", "vllm-api", "api", "redis", "gateway")
SPARING = (*STAGES, "api", "redis")  # the kinds that neither kill vLLM nor its gateway
# The operator's own run: its client holds the admin token, since the SWE rows name their repository
# on this machine (`repo_path`, an execution setting only an admin may give).
TOKENS = {
    "ROLLOUTS_API_TOKENS": "chaos-trainer",
    "ROLLOUTS_ADMIN_TOKENS": "chaos-admin",
    "ROLLOUTS_TOKEN": "chaos-admin",
}
RETRY = RetryPolicy(retries=60, first_delay_s=0.5, max_delay_s=5.0)  # rides out a restart of the API or Redis
BACK_CAP_S = 900.0  # how long a victim may take to serve again before the run gives up (never a pass mark)
DRAIN_CAP_S = 1800.0  # how long the jobs in flight at the end may take


class Ledger:
    """What the client saw: each submission key's job ids, each job's end, the kills; appended to a file too."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.keys: dict[str, list[str]] = {}
        self.kinds: dict[str, str] = {}  # job id -> task kind
        self.ended: dict[str, dict[str, Any]] = {}
        self.kills: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.held: set[str] = set()  # every job id Redis was seen holding
        self.ends: Counter[str] = Counter()  # job id -> ends Redis published for it

    def write(self, event: str, **fields: Any) -> None:
        with self.lock:
            self.out.write(json.dumps({"event": event, "t": round(time.time(), 3), **fields}) + "\n")
            self.out.flush()


def stream(
    client: RolloutClient, ledger: Ledger, rows: list[dict[str, Any]], in_flight: int, stop: threading.Event
) -> None:
    """Keep `in_flight` jobs running until `stop`, then follow the rest to their end."""
    outstanding: list[str] = []
    pending: tuple[str, list[dict[str, Any]]] | None = None  # a submission not yet answered: retried under its key
    sequence = 0
    drain_deadline: float | None = None
    while outstanding or pending or not stop.is_set():
        if stop.is_set() and drain_deadline is None:
            drain_deadline = time.monotonic() + DRAIN_CAP_S
        if drain_deadline is not None and time.monotonic() > drain_deadline:
            ledger.write("gave_up", outstanding=outstanding)
            return
        try:
            if pending is None and not stop.is_set() and len(outstanding) < in_flight:
                jobs = [rows[(sequence + i) % len(rows)] for i in range(in_flight - len(outstanding))]
                pending = (f"chaos-{sequence}", jobs)
                sequence += len(jobs)
            if pending is not None:
                key, jobs = pending
                ids = client.submit_jobs(jobs, idempotency_key=key)
                with ledger.lock:
                    ledger.keys[key] = ids
                    ledger.kinds.update((job_id, job["task"]["kind"]) for job_id, job in zip(ids, jobs, strict=True))
                ledger.write("submitted", key=key, ids=ids)
                outstanding += [i for i in ids if i not in outstanding]
                pending = None
            if outstanding:
                for summary in client.job_summaries(outstanding[:100], wait_s=5.0):
                    if summary.finished:
                        settle(client, ledger, summary.id)
                        outstanding.remove(summary.id)
        except ApiError as exc:
            if exc.status_code < 500:  # the bench's own jobs refused: no chaos explains that, so stop here
                ledger.write("refused", error=str(exc)[:300])
                stop.set()  # the run ends here: the kills stop, the report says why
                raise
            ledger.write("client_error", error=f"{type(exc).__name__}: {exc}"[:300])
            time.sleep(2.0)
        except httpx.HTTPError as exc:  # past the client's retries: the service is still down
            ledger.write("client_error", error=f"{type(exc).__name__}: {exc}"[:300])
            time.sleep(2.0)


def settle(client: RolloutClient, ledger: Ledger, job_id: str) -> None:
    """An ended job's record: how it ended, when, and what the kills cost it (stage attempts, failovers)."""
    job = client.get_job(job_id)
    end = {
        "id": job_id,
        "kind": ledger.kinds.get(job_id, job.kind),
        "status": job.status,
        "latency_s": round((job.finished_at or time.time()) - job.created_at, 3),
        "finished_at": job.finished_at,
        "attempts": job.raw.get("attempts", {}),
        "failovers": sum(job.failovers.values()),
        "error": job.error,
    }
    with ledger.lock:
        ledger.ended[job_id] = end
    ledger.write("ended", **end)


def redis_sampler(redis_url: str, keys: Keys, ledger: Ledger, period: float, stop: threading.Event) -> None:
    """Every `period` s: Redis' used_memory, and (every fourth look) every job id it holds a record of, so
    the report can name jobs the client was never given (a submission taken twice); records live
    `job_ttl_s` after their end, far longer than a look's period. A look while Redis restarts is skipped."""
    looks = 0
    while not stop.wait(period):
        try:
            with Redis.from_url(redis_url, socket_timeout=5) as redis:
                memory = used_memory(redis)
                held = held_job_ids(redis, keys) if looks % 4 == 0 else set()
        except (RedisError, OSError):
            continue
        looks += 1
        with ledger.lock:
            ledger.held |= held
        sample = {"t": time.time(), "used_memory": memory, "ended": len(ledger.ended), "held": len(held)}
        ledger.samples.append(sample)
        ledger.write("redis", **sample)


def held_job_ids(redis: Redis, keys: Keys) -> set[str]:
    """Every job id Redis holds, in any status (the status indexes)."""
    return {m.decode() for status in ALL_STATUSES for m in redis.zrange(keys.jobs_by_status(status), 0, -1)}


def count_ends(redis_url: str, keys: Keys, ledger: Ledger, stop: threading.Event) -> None:
    """Every job end Redis publishes ("<id> <status>" on the ends channel), counted per job: a job can move
    to an end once (the fencing token), so a second would show here. Ends published while the
    subscription is down (Redis restarting) are missed: the count is a floor, never a false double."""
    while not stop.is_set():
        try:
            with Redis.from_url(redis_url, socket_timeout=5) as redis, redis.pubsub() as pubsub:
                pubsub.subscribe(keys.job_ends)
                while not stop.is_set():
                    message = pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        job_id = message["data"].decode().split(" ", 1)[0]
                        with ledger.lock:
                            ledger.ends[job_id] += 1
        except (RedisError, OSError):
            stop.wait(1.0)


def chaos_victim(run: Run, kind: str) -> int:
    """The pid to SIGKILL: a stage's worker process, the gateway (vLLM's registrar) or one of stack_faults'."""
    stack = run.stack
    if kind in STAGES:
        return stack.workers[kind][0].pid
    if kind == "gateway":
        [registrar] = stack.registrars  # the stack registers one backend: its own vLLM, behind the gateway
        return registrar.pid
    return victim(run, kind)


def chaos_serving_again(run: Run, kind: str, killed: float, old_pid: int) -> bool:
    if kind in STAGES:
        return bool(run.said_since(killed, f"worker {kind}-0", "restarted"))
    if kind == "gateway":
        return bool(run.said_since(killed, "vLLM's registrar", "restarted")) and run.backend_serving()
    return serving_again(run, kind, killed, old_pid)


def killer(run: Run, ledger: Ledger, kinds: list[str], every: float, seed: int, stop: threading.Event) -> None:
    """SIGKILL a process every `every` s (± a third), the kinds in shuffled rounds, until `stop`; each victim
    serves again before the next kill (and before this returns: no kill is left half-way at the end)."""
    rng = random.Random(seed)
    order: list[str] = []
    while not stop.wait(every * rng.uniform(2 / 3, 4 / 3)):
        if not order:
            order = rng.sample(kinds, len(kinds))
        kind = order.pop()
        pid = chaos_victim(run, kind)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        kill = {"kind": kind, "pid": pid, "at": time.time(), "in_flight": len(ledger.kinds) - len(ledger.ended)}
        ledger.write("killed", **kill)
        try:
            wait(partial(chaos_serving_again, run, kind, killed, pid), f"the {kind} to serve again", cap=BACK_CAP_S)
            kill["back_s"] = round(time.monotonic() - killed, 1)
        except SystemExit as exc:  # reported as such; the stream goes on and the verdict counts its jobs
            kill["back_s"] = f"not within {BACK_CAP_S:.0f} s: {exc}"
        ledger.kills.append(kill)
        ledger.write("back", **kill)


def windows(ledger: Ledger, start: float, width: float) -> list[dict[str, Any]]:
    """Per window of `width` s from `start`: jobs ended per second, p50/p99/max latency, Redis memory at its end."""
    ends = sorted((e["finished_at"], e["latency_s"]) for e in ledger.ended.values() if e["finished_at"])
    last = max([t for t, _ in ends] + [start])
    rows = []
    lo = start
    while lo < last:
        hi = lo + width
        latencies = sorted(latency for t, latency in ends if lo <= t < hi)
        memory = [s["used_memory"] for s in ledger.samples if lo <= s["t"] < hi]
        rows.append(
            {
                "from_min": round((lo - start) / 60, 1),
                "jobs_per_s": round(len(latencies) / width, 3),
                "p50_s": round(statistics.median(latencies), 1) if latencies else None,
                "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1)
                if latencies
                else None,
                "max_s": round(latencies[-1], 1) if latencies else None,
                "redis_mib": round(memory[-1] / 2**20, 2) if memory else None,
                "kills": [k["kind"] for k in ledger.kills if lo <= k["at"] < hi],
            }
        )
        lo = hi
    return rows


def plot(rows: list[dict[str, Any]], ledger: Ledger, start: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["from_min"] for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    series = (
        ("jobs_per_s", "jobs ended / s"),
        ("p99_s", "p99 submit -> end (s)"),
        ("redis_mib", "Redis used_memory (MiB)"),
    )
    for ax, (field, label) in zip(axes, series, strict=True):
        ax.plot(minutes, [r[field] for r in rows], marker=".")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        for kill in ledger.kills:
            ax.axvline((kill["at"] - start) / 60, color="grey", alpha=0.3, linewidth=0.8)
    for kill in ledger.kills:
        axes[0].annotate(kill["kind"], ((kill["at"] - start) / 60, 0), rotation=90, fontsize=6, va="bottom")
    axes[-1].set_xlabel("minutes (grey lines: a process SIGKILLed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(ledger: Ledger, start: float, args: argparse.Namespace) -> int:
    """The tables, the plot and the verdict: 1 if a job was lost, submitted twice, or did not end done."""
    ids = [i for key_ids in ledger.keys.values() for i in key_ids]
    lost = sorted(set(ids) - set(ledger.ended))
    ended = Counter(e["status"] for e in ledger.ended.values())
    rerun = Counter(stage for e in ledger.ended.values() for stage, n in e["attempts"].items() if int(n) > 1)
    by_kind = Counter(e["kind"] for e in ledger.ended.values() if e["status"] == "done")
    hours = (max([e["finished_at"] or start for e in ledger.ended.values()] + [start]) - start) / 3600
    print(f"\n{len(ids)} jobs submitted under {len(ledger.keys)} keys in {hours:.2f} h; ended {dict(ended)}")
    never_given = ledger.held - set(ids)
    doubled_ends = sorted(job_id for job_id, n in ledger.ends.items() if n > 1)
    print(f"lost: {len(lost)}; ids given for two submissions: {len(ids) - len(set(ids))}")
    print(f"jobs Redis held that the client was never given: {len(never_given)} (of {len(ledger.held)} seen there)")
    print(
        f"ends Redis published: {sum(ledger.ends.values())} for {len(ledger.ends)} jobs; jobs that ended twice: {len(doubled_ends)}"
    )
    print(f"done by kind: {dict(by_kind)}; jobs with a stage run again after a kill: {dict(rerun)}")
    print(f"jobs with a model call failed over: {sum(1 for e in ledger.ended.values() if e['failovers'])}")
    errors = Counter(
        str((e["error"] or {}).get("type", e["error"]))[:120] for e in ledger.ended.values() if e["status"] != "done"
    )
    if errors:
        print(f"not done: {dict(errors)}")
    print("\n| kill | process | jobs in flight | serving again after (s) |\n|---:|---|---:|---:|")
    for n, kill in enumerate(ledger.kills, 1):
        print(f"| {n} | {kill['kind']} | {kill['in_flight']} | {kill['back_s']} |")
    rows = windows(ledger, start, args.window)
    print(
        "\n| minutes from | jobs/s | p50 (s) | p99 (s) | max (s) | Redis MiB | kills |\n|---:|---:|---:|---:|---:|---:|---|"
    )
    for r in rows:
        cells = [
            r["from_min"],
            r["jobs_per_s"],
            r["p50_s"],
            r["p99_s"],
            r["max_s"],
            r["redis_mib"],
            ", ".join(r["kills"]),
        ]
        print("| " + " | ".join("-" if cell is None else str(cell) for cell in cells) + " |")
    if rows and not args.no_plot:
        plot(rows, ledger, start, args.out / "chaos.png")
        print(f"plot: {args.out / 'chaos.png'}")
    twice = len(ids) != len(set(ids)) or never_given or doubled_ends
    return int(bool(lost or twice or set(ended) - {"done"}))


def chaos(run: Run, ledger: Ledger, rows: list[dict[str, Any]], kinds: list[str], args: argparse.Namespace) -> None:
    """The stream, the kills and the Redis samples for `args.hours`; then the drain, and the stack stopped
    (which ends the supervision on the main thread)."""
    stop_stream, stop_side = threading.Event(), threading.Event()
    client = RolloutClient(run.stack.api_url, "chaos-admin", retry=RETRY, timeout=60)
    threads = [
        threading.Thread(target=killer, args=(run, ledger, kinds, args.every, args.seed, stop_stream)),
        threading.Thread(target=stream, args=(client, ledger, rows, args.in_flight, stop_stream)),
    ]
    assert run.stack.redis is not None
    keys = Keys(run.stack.settings.redis_prefix)
    threads += [
        threading.Thread(target=redis_sampler, args=(run.stack.redis.url, keys, ledger, 15.0, stop_side)),
        threading.Thread(target=count_ends, args=(run.stack.redis.url, keys, ledger, stop_side)),
    ]
    try:
        for thread in threads:
            thread.start()
        stop_stream.wait(args.hours * 3600)
        stop_stream.set()
        for thread in threads[:2]:  # the last kill's victim back, every job followed to its end
            thread.join()
        print("restarts:", run.api.get("/v1/status").json().get("restarts"))
    finally:
        stop_stream.set()
        stop_side.set()
        for thread in threads:
            if thread.is_alive():
                thread.join()
        run.stack.stop(timeout=20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--every", type=float, default=180.0, help="seconds between kills (± a third)")
    parser.add_argument("--in-flight", type=int, default=32, help="jobs the client keeps running")
    parser.add_argument("--kinds", default=",".join(KINDS), help="what may be killed")
    parser.add_argument("--window", type=float, default=300.0, help="seconds per row of the time table")
    parser.add_argument("--job-ttl", type=int, default=1200, help="job_ttl_s: how long finished records stay in Redis")
    parser.add_argument("--seed", type=int, default=47)
    parser.add_argument(
        "--out", type=Path, default=None, help="where chaos.jsonl and chaos.png go (default: a temp dir)"
    )
    parser.add_argument("--no-plot", action="store_true")
    add_backend_option(parser, f" (given: one, and only --kinds among {','.join(SPARING)})")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if set(kinds) - set(KINDS) or not kinds:
        parser.error(f"--kinds: choose from {', '.join(KINDS)}")
    if args.backend_url and (set(kinds) - set(SPARING) or len(args.backend_url) > 1):
        parser.error(f"--backend-url: one server, and --kinds among {', '.join(SPARING)}")

    from tests.support.addresses import node_address
    from tests.support.vllm_server import SERVED_NAME

    root = Path(tempfile.mkdtemp(prefix="chaos-"))
    args.out = args.out or root
    args.out.mkdir(parents=True, exist_ok=True)
    node = node_address()
    settings = Settings(
        redis_url=None,
        state_dir=root / "state",
        api_host=node,
        api_tokens=["chaos-trainer"],
        admin_tokens=["chaos-admin"],
        token="chaos-admin",
        vllm_served_model_name=SERVED_NAME,
        vllm_args="--dtype float32 --max-model-len 4096",
        vllm_restart_budget=1000,  # the run's own kills: past the default 3 an hour the server would stay down
        job_ttl_s=args.job_ttl,
        results_ttl_s=args.job_ttl,
    )
    env = {
        **TOKENS,
        "ROLLOUTS_API_HOST": node,
        "ROLLOUTS_JOB_TTL_S": str(args.job_ttl),
        "ROLLOUTS_RESULTS_TTL_S": str(args.job_ttl),
        "ROLLOUTS_LOG_LEVEL": "WARNING",
    }
    run = Run.of(settings, root, args.backend_url, token="chaos-admin", extra_env=env)
    stack = run.stack
    rows = mixed_rows()
    with (args.out / "chaos.jsonl").open("w") as out:
        ledger = Ledger(out)
        stack.start()
        run.api.base_url = httpx.URL(stack.api_url)
        start = time.time()
        try:
            stack.wait_for_workers()
            wait(run.backend_serving, "the backend to serve")
            start = time.time()
            controller = threading.Thread(target=chaos, args=(run, ledger, rows, kinds, args), name="chaos")
            controller.start()
            stack.supervise()  # on the main thread, as `rollouts up` does: what it restarts dies with this process
            controller.join()
        finally:
            stack.stop(timeout=20)
        code = report(ledger, start, args)
    print(f"logs: {root / 'logs'}; progress: {args.out / 'chaos.jsonl'}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
