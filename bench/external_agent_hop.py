"""What the API's forwarding route adds per call and costs the API in CPU, against an instant worker.

bench/external_agent_endpoint.py measures the whole path with a real vLLM; on a 2-core machine its API - worker
difference is mostly scheduling noise between the processes (vLLM keeps both cores busy). Here
the worker is instant (a process answering a fixed chat-sized body and naming the job, as a
worker's endpoint does), so what remains is the route itself: its latency over calling the worker
directly, and the API process's CPU time per call (from /proc). With `--before REF`, a second API
process runs the code of git ref REF (exported to a temporary directory) side by side, calls
interleaved, so two versions of the route are compared in one run.

    .venv/bin/python -m bench.external_agent_hop [--calls 600] [--before REF]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from redis import Redis

from bench.process_cpu import cpu_seconds
from cli.embedded_redis import EmbeddedRedis, free_port
from shared.external_agent_tokens import JOB_HEADER, job_token
from shared.keys import Keys

SECRET = "bench-secret-0123456789abcdef"
ANSWER = (
    b'{"id":"chatcmpl-1","object":"chat.completion","model":"tiny","choices":[{"index":0,"message":'
    b'{"role":"assistant","content":"' + b"word " * 80 + b'"},"finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":40,"completion_tokens":8,"total_tokens":48}}'
)
ROOT = Path(__file__).resolve().parents[1]


def serve_instant(port: int, job_id: str) -> None:
    """The instant worker: any POST gets ANSWER at once, naming `job_id`."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def answer(request: Request) -> Response:
        await request.body()
        return Response(ANSWER, media_type="application/json", headers={JOB_HEADER: job_id})

    app = Starlette(routes=[Route("/{path:path}", answer, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def export_ref(ref: str, into: Path) -> Path:
    """The tree of git ref `ref` in `into`: `python -m cli api` run there serves that version's API."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _wait(http: httpx.Client, url: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            if http.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--before", metavar="REF", help="also run the API of this git ref, side by side")
    parser.add_argument("--serve-instant", nargs=2, metavar=("PORT", "JOB"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_instant:
        serve_instant(int(args.serve_instant[0]), args.serve_instant[1])
        return

    work = Path(tempfile.mkdtemp(prefix="bench-hop-"))
    redis = EmbeddedRedis(data_dir=work / "redis").start()
    env = {
        **os.environ,
        "ROLLOUTS_REDIS_URL": redis.url,
        "ROLLOUTS_STATE_DIR": str(work / "state"),
        "ROLLOUTS_EXTERNAL_AGENT_SECRET": SECRET,
        "ROLLOUTS_LOG_LEVEL": "WARNING",
    }
    sources = {"api": ROOT}
    if args.before:
        sources[f"api@{args.before}"] = export_ref(args.before, work / "before")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        apis: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
        for name, source in sources.items():
            port = free_port()
            process = subprocess.Popen(
                [sys.executable, "-m", "cli", "api", "--port", str(port)],
                cwd=source,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            processes.append(process)
            apis[name] = (f"http://127.0.0.1:{port}", process)
        http = httpx.Client(timeout=60)
        for url, _ in apis.values():
            _wait(http, f"{url}/healthz")
        first = next(iter(apis.values()))[0]
        job_id = http.post(
            f"{first}/v1/jobs", json={"task": {"kind": "math", "problem": "1 + 1?", "answer": "2"}, "agent": "external"}
        ).json()["job_ids"][0]
        worker_port = free_port()
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "bench.external_agent_hop", "--serve-instant", str(worker_port), job_id],
                cwd=ROOT,
            )
        )
        worker = f"http://127.0.0.1:{worker_port}"
        _wait(http, f"{worker}/healthz")  # a GET: 405, but it answers
        with Redis.from_url(redis.url) as r:  # as the rollout stage's take and registration leave the record
            r.hset(Keys().job(job_id), "status", "rollout")
            r.set(Keys().external_agent_endpoint(job_id), worker)
        headers = {"Authorization": f"Bearer {job_token(SECRET.encode(), job_id)}"}
        body = {"model": "tiny", "messages": [{"role": "user", "content": "What is 1 + 1? " * 20}], "max_tokens": 8}
        targets = {
            "worker": f"{worker}/v1/chat/completions",
            **{name: f"{url}/v1/jobs/{job_id}/agent/v1/chat/completions" for name, (url, _) in apis.items()},
        }
        times: dict[str, list[float]] = {name: [] for name in targets}
        names = list(targets)
        cpu_before: dict[str, float] = {}
        for i in range(args.calls + 50):  # the first 50 rounds warm up (and let the endpoint cache subscribe)
            if i == 50:
                cpu_before = {name: cpu_seconds(process.pid) for name, (_, process) in apis.items()}
            for name in names[i % len(names) :] + names[: i % len(names)]:
                t0 = time.perf_counter()
                response = http.post(targets[name], json=body, headers=headers)
                elapsed = time.perf_counter() - t0
                assert response.status_code == 200 and response.content == ANSWER, (name, response.text)
                if i >= 50:
                    times[name].append(elapsed)
        base = statistics.median(times["worker"])
        print(f"{args.calls} calls each, round-robin, instant worker; load average {os.getloadavg()[0]:.1f}")
        for name in names:
            p50 = statistics.median(times[name])
            line = f"{name:>16}: p50 {p50 * 1e3:6.3f} ms  p50 - worker {(p50 - base) * 1e3:+6.3f} ms"
            if name in apis:
                cpu = (cpu_seconds(apis[name][1].pid) - cpu_before[name]) / args.calls
                line += f"  API CPU per call {cpu * 1e3:.3f} ms"
            print(line)
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
        redis.stop()


if __name__ == "__main__":
    main()
