"""Issue 36's fault run: 96 mixed jobs under `rollouts up`, one process SIGKILLed mid-run, per process.

One stack, started as `rollouts up` starts it (`cli.stack.Stack` with the embedded Redis kept on its
append-only file, the embedded vLLM server on the tiny model, the supervisor on a thread). Each round
submits 96 jobs (examples/mixed.jsonl's math, STEM, code and SWE rows, twelve times) and, once a
quarter of them have ended, SIGKILLs one process: vLLM's engine (`VLLM::EngineCore`), vLLM's API
server process, the service's API process or the embedded Redis. The four rounds run first on the
base weights, then again after a weight update (step-1), with vLLM's restart budget raised above
the run's four vLLM kills (the default is 3 an hour). Per round it reports: how every job ended,
jobs whose record shows a failover, the time from the kill to serving again (vLLM: back in the
pool, healthy and open; the API and Redis: /healthz 200), and for vLLM after the update the
version the restarted server reports and the logprob gap to the updated weights (transformers).

    .venv/bin/python -m bench.stack_faults [--jobs 96] [--rounds engine,vllm-api,api,redis]

With `--backend-url URL` the stack uses a vLLM server that already runs instead of its own, and only
the rounds that leave it alone run (`--rounds api,redis --no-update`): nothing kills it or changes its weights.

A measurement, not a test (tests/reliability/test_stack_restarts.py asserts the same behaviour on a
few jobs): it imports the tests' tiny model and weight-update helpers, as that test does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.backends import add_backend_option
from cli.stack import Stack
from shared.config import Settings

ROWS = Path(__file__).resolve().parent.parent / "examples" / "mixed.jsonl"
KILLS = ("engine", "vllm-api", "api", "redis")
SPARING = ("api", "redis")  # the rounds that neither kill vLLM nor change its weights
CAP_S = 1800.0  # how long a round may take before the run gives up on it (never a pass mark)
TERMINAL = {"done", "failed", "cancelled", "timed_out"}


def mixed_rows() -> list[dict[str, Any]]:
    """examples/mixed.jsonl's jobs: math, STEM, code and SWE rows."""
    return [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]


class Run:
    """The stack under test, its log lines with their times, and the probes the rounds use."""

    def __init__(self, stack: Stack, api: httpx.Client) -> None:
        self.stack, self.api = stack, api
        self.lines: list[tuple[float, str]] = []
        stack.on_progress = self.said

    @classmethod
    def of(
        cls, settings: Settings, root: Path, backend_urls: list[str] | None, token: str | None = None, **stack: Any
    ) -> Run:
        """A stack as `rollouts up` starts it for a fault run: the embedded Redis on its append-only file, the
        tiny model's vLLM unless `backend_urls` are given; logs under `root`; `stack`: Stack's other options."""
        from tests.support.vllm_server import tiny_model_path

        return cls(
            Stack(
                settings,
                api_port=0,
                log_dir=root / "logs",
                persistent_redis=True,
                vllm=not backend_urls,
                backend_urls=backend_urls,
                model=tiny_model_path(),
                drain_timeout_s=5,
                **stack,
            ),
            httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"} if token else None),
        )

    def said(self, line: str) -> None:
        """The stack's progress line, kept with its time (the probes read them) and printed."""
        self.lines.append((time.monotonic(), line))
        print(f"[stack] {line}", flush=True)

    def said_since(self, since: float, *words: str) -> float | None:
        return next((t for t, line in list(self.lines) if t >= since and all(w in line for w in words)), None)

    def healthz(self) -> bool:
        try:
            return self.api.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def backend_serving(self) -> bool:
        """The stack's vLLM is in the pool, healthy and open to new pins."""
        server = self.stack.vllm_server
        url = self.stack.registered_url(server.url if server is not None else self.stack.backend_urls[0])
        try:
            backends = self.api.get("/v1/backends").json()["backends"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return any(b["url"] == url.rstrip("/") and b["healthy"] and not b["draining"] for b in backends)

    def submit(self, n: int) -> list[str]:
        rows = mixed_rows()
        jobs = [rows[i % len(rows)] for i in range(n)]
        while True:  # a round starts right after the last one's restart: the API may still be coming up
            try:
                response = self.api.post("/v1/jobs", json=jobs, timeout=120)
                if response.status_code == 202:
                    return response.json()["job_ids"]
            except httpx.HTTPError:
                pass
            time.sleep(1)

    def records(self, ids: list[str], known: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Every ended job's record so far (a look that fails while the API or Redis restarts is skipped)."""
        for job_id in ids:
            if job_id in known:
                continue
            try:
                record = self.api.get(f"/v1/jobs/{job_id}").json()
            except (httpx.HTTPError, ValueError):
                return known
            if record.get("status") in TERMINAL:
                known[job_id] = record
        return known


def wait(condition: Any, what: str, cap: float = CAP_S, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + cap
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"gave up after {cap:.0f} s waiting for {what}")


def victim(run: Run, kill: str) -> int:
    """The pid to SIGKILL for a round."""
    stack = run.stack
    if kill == "api":
        return stack.api.pid
    if kill == "redis":
        return stack.redis.process.pid
    from tests.support.vllm_processes import vllm_process

    return vllm_process(stack.vllm_server, b"EngineCore" if kill == "engine" else b"vllm.entrypoints.openai.api_server")


def serving_again(run: Run, kill: str, killed: float, old_pid: int) -> bool:
    stack = run.stack
    if kill == "api":
        return stack.api is not None and stack.api.pid != old_pid and run.healthz()
    if kill == "redis":
        return bool(run.said_since(killed, "the embedded Redis", "restarted")) and run.healthz()
    return bool(run.said_since(killed, "vLLM", "restarted")) and run.backend_serving()


def one_round(run: Run, kill: str, jobs: int, version: str | None, model: Path | None) -> dict[str, Any]:
    ids = run.submit(jobs)
    known: dict[str, dict[str, Any]] = {}
    wait(lambda: len(run.records(ids, known)) >= jobs // 4 or None, "a quarter of the jobs to end", interval=1.0)
    in_flight = jobs - len(known)
    pid = victim(run, kill)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait(lambda: serving_again(run, kill, killed, pid), f"the {kill} to serve again")
    back_s = time.monotonic() - killed
    wait(lambda: len(run.records(ids, known)) == jobs or None, "every job to end", interval=2.0)
    ended = Counter(r["status"] for r in known.values())
    failed_over = sum(1 for r in known.values() if r.get("failovers"))
    row: dict[str, Any] = {
        "kill": kill,
        "update": version or "-",
        "jobs": jobs,
        "in_flight_at_kill": in_flight,
        "ended": dict(ended),
        "failed_over": failed_over,
        "back_s": round(back_s, 1),
        "errors": sorted({str(r.get("error"))[:160] for r in known.values() if r["status"] != "done"}),
    }
    if version is not None and kill in ("engine", "vllm-api") and model is not None:
        from tests.support.weight_checks import gap_to, sample

        url = run.stack.vllm_server.url
        row["served_version"] = httpx.get(f"{url}/weight_info", timeout=30).json().get("weight_version")
        tokens, logprobs = sample(url, seed=7)
        row["logprob_gap_to_update"] = float(f"{gap_to(model, tokens, logprobs):.1e}")
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=96)
    parser.add_argument("--rounds", default=",".join(KILLS), help="which processes to kill, in order")
    parser.add_argument("--no-update", action="store_true", help="only the rounds on the base weights")
    add_backend_option(parser, f" (given: one, and only --rounds {','.join(SPARING)} with --no-update)")
    args = parser.parse_args(argv)
    kills = [k for k in args.rounds.split(",") if k]
    unknown = set(kills) - set(KILLS)
    if unknown:
        parser.error(f"--rounds: unknown {sorted(unknown)}; choose from {', '.join(KILLS)}")
    if args.backend_url and (set(kills) - set(SPARING) or not args.no_update or len(args.backend_url) > 1):
        parser.error(f"--backend-url: one server, --rounds among {', '.join(SPARING)} and --no-update")

    from tests.support.vllm_server import SERVED_NAME
    from tests.support.weight_checks import checkpoint

    root = Path(tempfile.mkdtemp(prefix="stack-faults-"))
    settings = Settings(
        redis_url=None,
        state_dir=root / "state",
        vllm_served_model_name=SERVED_NAME,
        vllm_args="--dtype float32 --max-model-len 4096",
        vllm_restart_budget=10,
    )
    run = Run.of(settings, root, args.backend_url)
    stack = run.stack
    stack.start()
    run.api.base_url = httpx.URL(stack.api_url)
    supervisor = threading.Thread(target=stack.supervise, name="supervise", daemon=True)
    rows: list[dict[str, Any]] = []
    try:
        stack.wait_for_workers()
        supervisor.start()
        wait(run.backend_serving, "the backend to serve")
        for kill in kills:
            rows.append(one_round(run, kill, args.jobs, None, None))
            print(json.dumps(rows[-1]), flush=True)
        if not args.no_update:
            updated = checkpoint(root, 1)
            response = run.api.post(
                f"/v1/models/{SERVED_NAME}/weights", json={"version": "step-1", "path": str(updated)}, timeout=600
            )
            assert response.status_code == 200, response.text
            for kill in kills:
                rows.append(one_round(run, kill, args.jobs, "step-1", updated))
                print(json.dumps(rows[-1]), flush=True)
        print("restarts:", run.api.get("/v1/status").json().get("restarts"))
    finally:
        stack.stop(timeout=20)
        supervisor.join(timeout=30)
    print(
        "\n| process killed | weights | jobs in flight at the kill | ended | records with a failover | "
        "kill to serving again (s) | version after | logprob gap |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ended = ", ".join(f"{n} {s}" for s, n in sorted(r["ended"].items()))
        print(
            f"| {r['kill']} | {r['update']} | {r['in_flight_at_kill']} | {ended} | {r['failed_over']} | "
            f"{r['back_s']} | {r.get('served_version', '')} | {r.get('logprob_gap_to_update', '')} |"
        )
    print(f"logs: {root / 'logs'}")


if __name__ == "__main__":
    main()
