"""What a node gateway adds per generate call and at 32 concurrent rollouts, against calling vLLM directly.

One vLLM server (the CPU build on the tiny model) on loopback; one node gateway in front of it,
a process of its own as `rollouts register --gateway` runs it (this module with `--serve`). The
calls are the workers' own: LLMClient to `/inference/v1/generate`, greedy, `ignore_eos`, so every
call generates the same `--max-tokens` tokens. Side by side in one run:

- **latency**: `--calls` sequential calls, alternating direct and through the gateway; p50 and
  p99 of each and the p50 difference (goal: under 1 ms), and the gateway process's own CPU time
  per call (user + system, from /proc), which a busy machine's scheduling does not inflate;
- **throughput**: 32 threads, each a rollout making `--turns` calls one after another (its next
  prompt extends the last), all at once; directly, then through the gateway, `--rounds` times
  each, interleaved, so a drift of the machine shows; calls/s of each (goal: no loss);
- **the proxy alone**: the same sequential calls against an instant upstream (a process answering
  a fixed generate-sized body at once, no vLLM), direct and through a second gateway: what the hop
  itself costs when no model shares the CPU with it.

    .venv/bin/python -m bench.gateway [--calls 300] [--max-tokens 8] [--rollouts 32] [--turns 12] [--rounds 3]
        [--backend-url URL]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.backends import add_backend_option, vllm_urls
from bench.process_cpu import cpu_seconds
from cli.embedded_redis import free_port
from gateway.app import GatewayConfig
from gateway.server import gateway_server
from shared.config import Settings
from workers.rollout.llm_client import LLMClient
from workers.rollout.llm_completion import Sampling

ROOT = Path(__file__).resolve().parents[1]
DATA_TOKEN, ADMIN_TOKEN = "bench-data-key", "bench-admin-key"
PROMPT = [(11 * i) % 200 + 40 for i in range(64)]
INSTANT = json.dumps(
    {
        "request_id": "x",
        "choices": [
            {
                "index": 0,
                "token_ids": list(range(8)),
                "logprobs": {"content": [{"logprob": -0.5}] * 8},
                "finish_reason": "length",
            }
        ],
        "prompt_token_ids": None,
        "usage": {"prompt_tokens": 64, "completion_tokens": 8},
    }
).encode()


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def instant(scope: dict, receive: Any, send: Any) -> None:
    """An upstream that answers every call at once with a fixed body the size of a short generation."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        return await send({"type": "lifespan.shutdown.complete"})
    while (await receive()).get("more_body"):
        pass
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(INSTANT)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": INSTANT})


def serve_instant(port: int) -> None:
    import uvicorn

    print("serving", flush=True)
    uvicorn.run(instant, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve(upstream: str, port: int) -> None:
    """The gateway alone, until killed: what `rollouts register --gateway` runs beside its registration."""
    settings = Settings(backend_token=DATA_TOKEN, backend_admin_token=ADMIN_TOKEN)
    server = gateway_server(GatewayConfig.from_settings(upstream, settings), "127.0.0.1", port).start()
    print("serving", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


def rollout(client: LLMClient, url: str, sampling: Sampling, turns: int, seed: int) -> int:
    """One multi-turn rollout's model calls: each prompt is the last one plus what came back."""
    prompt = [*PROMPT, 40 + seed % 150]
    for _ in range(turns):
        prompt = prompt + client.complete(url, prompt, sampling, "tiny").token_ids
    return turns


def throughput(client: LLMClient, url: str, sampling: Sampling, rollouts: int, turns: int) -> float:
    with ThreadPoolExecutor(rollouts) as pool:
        start = time.perf_counter()
        calls = sum(pool.map(lambda i: rollout(client, url, sampling, turns, i), range(rollouts)))
        return calls / (time.perf_counter() - start)


Call = Callable[[], int]  # one generate call; returns the tokens it generated


def latency(title: str, calls: dict[str, Call], n: int, gateway_pid: int) -> None:
    """`n` sequential calls of each, alternating which goes first, after 20 warm-up rounds; prints p50,
    p99, the p50 difference to `direct`, and the gateway process's CPU time per call."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    cpu_before = 0.0
    for i in range(n + 20):
        if i == 20:
            cpu_before = cpu_seconds(gateway_pid)
        for name in ("direct", "gateway") if i % 2 else ("gateway", "direct"):
            t0 = time.perf_counter()
            calls[name]()
            if i >= 20:
                times[name].append(time.perf_counter() - t0)
    cpu_per_call = (cpu_seconds(gateway_pid) - cpu_before) / n
    base = statistics.median(times["direct"])
    print(title)
    for name, values in times.items():
        p50 = statistics.median(values)
        print(
            f"  {name:>8}: p50 {p50 * 1e3:7.2f} ms  p99 {percentile(values, 99) * 1e3:7.2f} ms  "
            f"p50 - direct {(p50 - base) * 1e3:+6.2f} ms"
        )
    print(f"  gateway process CPU per call: {cpu_per_call * 1e3:.2f} ms")


def start_gateway(upstream: str) -> tuple[subprocess.Popen[str], str]:
    """A gateway in a process of its own in front of `upstream`, as `rollouts register --gateway` runs it."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.gateway", "--serve", upstream, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "serving"
    return process, f"http://127.0.0.1:{port}"


def proxy_alone(n: int) -> None:
    """The hop's own cost: the same calls against an instant upstream, no model sharing the CPU."""
    port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "bench.gateway", "--serve-instant", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert upstream.stdout is not None and upstream.stdout.readline().strip() == "serving"
    gateway, gateway_url = start_gateway(f"http://127.0.0.1:{port}")
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 8}, "model": "tiny"}
    try:
        with httpx.Client() as direct, httpx.Client(headers={"Authorization": f"Bearer {DATA_TOKEN}"}) as through:

            def call(client: httpx.Client, url: str) -> Call:
                return lambda: len(client.post(f"{url}/inference/v1/generate", json=body).content)

            wait_until_serving(direct, f"http://127.0.0.1:{port}")
            latency(
                f"the proxy alone: {n} sequential calls each to an instant upstream, alternating",
                {"direct": call(direct, f"http://127.0.0.1:{port}"), "gateway": call(through, gateway_url)},
                n,
                gateway.pid,
            )
    finally:
        for process in (gateway, upstream):
            process.terminate()
            process.wait(timeout=10)


def wait_until_serving(client: httpx.Client, url: str) -> None:
    for _ in range(100):
        try:
            client.post(f"{url}/inference/v1/generate", json={})
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def against_vllm(vllm_url: str, args: argparse.Namespace) -> None:
    """Latency and throughput, direct and through a gateway in front of the vLLM server at `vllm_url`."""
    gateway, gateway_url = start_gateway(vllm_url)
    try:
        targets = {
            "direct": (vllm_url, LLMClient(request_timeout_s=300, max_retries=0)),
            "gateway": (gateway_url, LLMClient(request_timeout_s=300, max_retries=0, api_key=DATA_TOKEN)),
        }
        sampling = Sampling(max_tokens=args.max_tokens, temperature=0.0, extra={"ignore_eos": True})

        def generate(name: str) -> Call:
            url, client = targets[name]
            return lambda: len(client.complete(url, PROMPT, sampling, "tiny").token_ids)

        latency(
            f"latency: {args.calls} sequential generate calls each, {args.max_tokens} tokens a call, alternating",
            {name: generate(name) for name in targets},
            args.calls,
            gateway.pid,
        )

        rates: dict[str, list[float]] = {name: [] for name in targets}
        for name in ("direct", "gateway") * args.rounds:
            url, client = targets[name]
            rates[name].append(throughput(client, url, sampling, args.rollouts, args.turns))
        print(
            f"throughput: {args.rollouts} concurrent rollouts x {args.turns} calls, {args.rounds} rounds each, "
            "interleaved"
        )
        for name, values in rates.items():
            runs = ", ".join(f"{rate:.1f}" for rate in values)
            print(f"  {name:>8}: {statistics.mean(values):6.1f} calls/s ({runs})")
        ratio = statistics.mean(rates["gateway"]) / statistics.mean(rates["direct"])
        print(f"  gateway / direct: {ratio:.3f}")
    finally:
        gateway.terminate()
        gateway.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", nargs=2, metavar=("UPSTREAM", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-instant", type=int, metavar="PORT", help=argparse.SUPPRESS)
    add_backend_option(parser, " (one is used)")
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.serve[0], int(args.serve[1]))
    if args.serve_instant:
        return serve_instant(args.serve_instant)

    with vllm_urls(args.backend_url, 1, Path(tempfile.mkdtemp(prefix="bench-gateway-"))) as (vllm_url, *_):
        against_vllm(vllm_url, args)
    proxy_alone(args.calls * 4)


if __name__ == "__main__":
    main()
