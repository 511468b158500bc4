"""What an external agent's endpoint adds per call, against calling vLLM's own chat endpoint, side by side.

One vLLM server (the CPU build on the tiny model, as the tests start it). The same chat request
(one system and one user message, greedy, `ignore_eos`, `--max-tokens` tokens, so every call
generates the same tokens) goes round-robin, in one process, to:

- **vllm**: vLLM's own `POST /v1/chat/completions` (it renders the template and tokenizes too);
- **worker**: the job's ProxySession on its rollout worker's port (workers/rollout/proxy/): render
  with ChatRenderer, token ids to `/inference/v1/generate` through LLMClient, parse tool calls,
  record the turn; each call is a fresh conversation, so each starts a new segment (a full prompt
  render, the dearer case);
- **api**: the same through the API's forwarding route (api/routes/agent.py: key check, one Redis
  round trip, an HTTP hop). The job is a real submitted `agent: external` job whose record is
  pointed at the endpoint above, as the rollout stage's take and registration leave it.

Reports p50 and p90 latency of each and the p50 differences (goal: < 5 ms).

    .venv/bin/python -m bench.agent_proxy [--calls 200] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from api.app import create_app
from cli.embedded_redis import EmbeddedRedis, free_port
from cli.tiny_model import tiny_model_dir
from cli.vllm_server import VLLMServer
from shared.agent_keys import job_key
from shared.config import Settings
from shared.keys import Keys
from workers.kinds.agentic import DEFAULT_TOOLS
from workers.rollout.agent_loop import LoopConfig
from workers.rollout.llm_client import LLMClient, Sampling
from workers.rollout.llm_services import _load_tokenizer
from workers.rollout.proxy.server import ThreadServer, build_app
from workers.rollout.proxy.session import ProxySession
from workers.rollout.tool_parsers import get_parser

SECRET = "bench-secret-0123456789abcdef"
MESSAGES = [{"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "What is 17 times 23? Think step by step."}]  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    model = tiny_model_dir(Path.home() / ".cache" / "rollouts" / "test-models", 0, 4096)
    settings = Settings(redis_url=None, state_dir=work / "state", agent_key_secret=SECRET)
    vllm = VLLMServer.from_settings(settings, model, free_port(), served_name="tiny", log_path=work / "vllm.log",
                                    args=["--dtype", "float32", "--max-model-len", "4096"])  # fmt: skip
    redis = EmbeddedRedis(data_dir=work / "redis").start()
    vllm.start()
    servers: list[ThreadServer] = []
    try:
        vllm.wait_until_ready(900, lambda message: print(message, flush=True))
        settings = settings.model_copy(update={"redis_url": redis.url})
        client = LLMClient(request_timeout_s=300, max_retries=0)
        sampling = Sampling(max_tokens=args.max_tokens, temperature=0.0, extra={"ignore_eos": True})
        config = LoopConfig(max_turns=10**6, max_context_tokens=4000, max_tokens_per_turn=args.max_tokens,
                            allowed_tools=DEFAULT_TOOLS)  # fmt: skip
        session = ProxySession(_load_tokenizer(str(model)), get_parser("hermes"),
                               lambda ids, s: client.complete(vllm.url, ids, s, "tiny"), None, config, sampling, "tiny")
        api = ThreadServer(create_app(settings), "127.0.0.1", lifespan="on").start()
        servers.append(api)
        http = httpx.Client(timeout=300)
        submitted = http.post(f"{api.url}/v1/jobs", json={
            "task": {"kind": "math", "problem": "17 * 23?", "answer": "391"}, "agent": "external"}).json()
        job_id = submitted["job_ids"][0]
        worker = ThreadServer(build_app(session, job_id, SECRET.encode(), lambda: {}), "127.0.0.1").start()
        servers.append(worker)
        from redis import Redis

        with Redis.from_url(redis.url) as r:  # as the rollout stage's take and registration leave the record
            r.hset(Keys().job(job_id), "status", "rollout")
            r.set(Keys().agent_proxy(job_id), worker.url)
        key = {"Authorization": f"Bearer {job_key(SECRET.encode(), job_id)}"}
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": args.max_tokens, "temperature": 0.0,
                "ignore_eos": True}  # fmt: skip
        targets = {"vllm": (f"{vllm.url}/v1/chat/completions", {}),
                   "worker": (f"{worker.url}/v1/chat/completions", key),
                   "api": (f"{api.url}/v1/jobs/{job_id}/agent/v1/chat/completions", key)}  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in targets}
        names = list(targets)
        for i in range(args.calls + 10):  # the first 10 rounds warm up every path
            for name in names[i % 3:] + names[: i % 3]:  # rotate the order: no path always goes first
                url, headers = targets[name]
                t0 = time.perf_counter()
                response = http.post(url, json=body, headers=headers)
                elapsed = time.perf_counter() - t0
                response.raise_for_status()
                assert response.json()["usage"]["completion_tokens"] == args.max_tokens, response.text
                if i >= 10:
                    times[name].append(elapsed)
        base = statistics.median(times["vllm"])
        print(f"{args.calls} calls each, {args.max_tokens} tokens a call, round-robin")
        for name in names:
            p50 = statistics.median(times[name])
            print(f"{name:>6}: p50 {p50 * 1e3:7.2f} ms  p90 {percentile(times[name], 90) * 1e3:7.2f} ms  "
                  f"p50 - vllm {(p50 - base) * 1e3:+6.2f} ms")
    finally:
        for server in servers:
            server.stop()
        vllm.stop()
        redis.stop()


if __name__ == "__main__":
    main()
