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
  each, interleaved, so a drift of the machine shows; calls/s of each (goal: no loss).

    .venv/bin/python -m bench.gateway [--calls 300] [--max-tokens 8] [--rollouts 32] [--turns 12] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from cli.embedded_redis import free_port
from cli.tiny_model import tiny_model_dir
from cli.vllm_server import VLLMServer
from gateway.app import GatewayConfig
from gateway.server import ThreadedServer
from shared.config import Settings
from workers.rollout.llm_client import LLMClient, Sampling

DATA_KEY, ADMIN_KEY = "bench-data-key", "bench-admin-key"
PROMPT = [(11 * i) % 200 + 40 for i in range(64)]


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def serve(upstream: str, port: int) -> None:
    """The gateway alone, until killed: what `rollouts register --gateway` runs beside its registration."""
    settings = Settings(backend_key=DATA_KEY, backend_admin_key=ADMIN_KEY)
    server = ThreadedServer.gateway(GatewayConfig.from_settings(upstream, settings), "127.0.0.1", port).start()
    print("serving", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rollout(client: LLMClient, url: str, sampling: Sampling, turns: int, seed: int) -> int:
    """One multi-turn rollout's model calls: each prompt is the last one plus what came back."""
    prompt = PROMPT + [40 + seed % 150]
    for _ in range(turns):
        prompt = prompt + client.complete(url, prompt, sampling, "tiny").token_ids
    return turns


def throughput(client: LLMClient, url: str, sampling: Sampling, rollouts: int, turns: int) -> float:
    with ThreadPoolExecutor(rollouts) as pool:
        start = time.perf_counter()
        calls = sum(pool.map(lambda i: rollout(client, url, sampling, turns, i), range(rollouts)))
        return calls / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", nargs=2, metavar=("UPSTREAM", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve[0], int(args.serve[1]))

    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    model = tiny_model_dir(Path.home() / ".cache" / "rollouts" / "test-models", 0, 4096)
    vllm = VLLMServer.from_settings(Settings(), model, free_port(), served_name="tiny", log_path=work / "vllm.log",
                                    args=["--dtype", "float32", "--max-model-len", "4096"])  # fmt: skip
    vllm.start()
    gateway: subprocess.Popen[str] | None = None
    try:
        vllm.wait_until_ready(900, lambda message: print(message, flush=True))
        port = free_port()
        gateway = subprocess.Popen([sys.executable, "-m", "bench.gateway", "--serve", vllm.url, str(port)],
                                   stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert gateway.stdout is not None and gateway.stdout.readline().strip() == "serving"
        targets = {"direct": (vllm.url, LLMClient(request_timeout_s=300, max_retries=0)),
                   "gateway": (f"http://127.0.0.1:{port}", LLMClient(request_timeout_s=300, max_retries=0,
                                                                     api_key=DATA_KEY))}  # fmt: skip
        sampling = Sampling(max_tokens=args.max_tokens, temperature=0.0, extra={"ignore_eos": True})

        times: dict[str, list[float]] = {name: [] for name in targets}
        cpu_before = 0.0
        for i in range(args.calls + 20):  # the first 20 rounds warm up both paths
            if i == 20:
                cpu_before = cpu_seconds(gateway.pid)
            for name in (("direct", "gateway") if i % 2 else ("gateway", "direct")):
                url, client = targets[name]
                t0 = time.perf_counter()
                generated = client.complete(url, PROMPT, sampling, "tiny").token_ids
                elapsed = time.perf_counter() - t0
                assert len(generated) == args.max_tokens, (name, generated)
                if i >= 20:
                    times[name].append(elapsed)
        cpu_per_call = (cpu_seconds(gateway.pid) - cpu_before) / args.calls
        base = statistics.median(times["direct"])
        print(f"latency: {args.calls} sequential generate calls each, {args.max_tokens} tokens a call, alternating")
        for name, values in times.items():
            p50 = statistics.median(values)
            print(f"  {name:>8}: p50 {p50 * 1e3:7.2f} ms  p99 {percentile(values, 99) * 1e3:7.2f} ms  "
                  f"p50 - direct {(p50 - base) * 1e3:+6.2f} ms")
        print(f"  gateway process CPU per call: {cpu_per_call * 1e3:.2f} ms")

        rates: dict[str, list[float]] = {name: [] for name in targets}
        for name in ("direct", "gateway") * args.rounds:
            url, client = targets[name]
            rates[name].append(throughput(client, url, sampling, args.rollouts, args.turns))
        print(f"throughput: {args.rollouts} concurrent rollouts x {args.turns} calls, {args.rounds} rounds each, "
              "interleaved")
        for name, values in rates.items():
            runs = ", ".join(f"{rate:.1f}" for rate in values)
            print(f"  {name:>8}: {statistics.mean(values):6.1f} calls/s ({runs})")
        ratio = statistics.mean(rates["gateway"]) / statistics.mean(rates["direct"])
        print(f"  gateway / direct: {ratio:.3f}")
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(timeout=10)
        vllm.stop()


if __name__ == "__main__":
    main()
