"""What an external agent's endpoint adds per call, against calling vLLM's own chat endpoint, side by side.

One vLLM server (the CPU build on the tiny model, as the tests start it). The same chat request
(one system and one user message, greedy, `ignore_eos`, `--max-tokens` tokens, so every call
generates the same tokens) goes round-robin, in one process, to:

- **vllm**: vLLM's own `POST /v1/chat/completions` with `logprobs: true` (it renders the template
  and tokenizes too, and computes the logprobs the record needs);
- **generate**: the same prompt's token ids (rendered once) through LLMClient to vLLM's
  `/inference/v1/generate`: what the endpoint itself sends, without the endpoint;
- **worker**: the job's ExternalAgentSession on its rollout worker's port (workers/rollout/external_agent/): render
  with ChatRenderer, token ids to `/inference/v1/generate` through LLMClient, parse tool calls,
  record the turn; each call repeats one named conversation's first call, so each starts a new
  segment (a full prompt render, the dearer case);
- **api**: the same through the API's forwarding route (api/routes/external_agent.py: key check, the job's
  worker address remembered after the first call, an HTTP hop), the API a process of its own as
  `rollouts api` runs it. The job is a real submitted `agent: external` job whose record is
  pointed at the endpoint above, as the rollout stage's take and registration leave it.

The endpoint runs in this process (as it runs in a rollout worker's), so it shares the GIL with
the measuring loop; vLLM and the API are processes of their own.

With `--before REF`, a second API process runs the code of git ref REF (bench/external_agent_hop.py's
export) beside this one, as **api@REF**, forwarding to the same worker endpoint: the route before
and after a change, in one run.

Reports p50 and p90 latency of each and the p50 differences from vllm (goals: worker - vllm < 2 ms,
api - worker < 2 ms).

Then time to first chunk, streamed (`stream: true`, `--stream-tokens` tokens a call, `--stream-calls`
rounds, round-robin): vLLM's own streaming chat completion against the job's endpoint streaming the
same request (its generation streamed from `/inference/v1/generate`), at the worker and through the
API; the time until the first `data:` line, and until the stream's end (goal: first chunk within
1.5x of vLLM's own).

    .venv/bin/python -m bench.external_agent_endpoint [--calls 200] [--max-tokens 8] [--before REF]
        [--stream-calls 100] [--stream-tokens 64] [--warmup 10] [--backend-url URL]
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
from typing import Any

import httpx

from bench.backends import add_backend_option, tiny_model, vllm_urls
from bench.external_agent_hop import ROOT, export_ref
from cli.embedded_redis import EmbeddedRedis, free_port
from shared.external_agent_tokens import job_token
from shared.keys import Keys
from shared.kinds.agentic import DEFAULT_TOOLS
from shared.thread_server import ThreadServer
from workers.rollout.agent_loop import LoopConfig
from workers.rollout.chat_delta import ChatRenderer
from workers.rollout.external_agent.server import build_app, endpoint_server
from workers.rollout.external_agent.session import ExternalAgentSession
from workers.rollout.llm_client import LLMClient
from workers.rollout.llm_completion import Sampling
from workers.rollout.llm_services import _load_tokenizer
from workers.rollout.tool_parsers import get_parser

SECRET = "bench-secret-0123456789abcdef"
MESSAGES = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 17 times 23? Think step by step."},
]


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def _wait_healthy(http: httpx.Client, url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if http.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API at {url} did not start")
        time.sleep(0.2)


def first_chunk(http: httpx.Client, url: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[float, float]:
    """Seconds to the first `data:` line of a streamed call, and to its end."""
    t0 = time.perf_counter()
    first = None
    with http.stream("POST", url, json={**body, "stream": True}, headers=headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data:"):
                first = time.perf_counter() - t0
    assert first is not None, url
    return first, time.perf_counter() - t0


def first_chunks(
    http: httpx.Client, targets: dict[str, tuple[str, dict[str, str]]], body: dict[str, Any], calls: int, warmup: int
) -> None:
    """Time to first chunk of each target's stream, round-robin, after `warmup` rounds; p50 and p99."""
    firsts: dict[str, list[float]] = {name: [] for name in targets}
    ends: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    for i in range(calls + warmup):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            first, end = first_chunk(http, *targets[name], body)
            if i >= warmup:
                firsts[name].append(first)
                ends[name].append(end)
    base = statistics.median(firsts["vllm"])
    print(f"time to first chunk, {calls} streamed calls each, {body['max_tokens']} tokens a call, round-robin")
    for name in names:
        p50 = statistics.median(firsts[name])
        print(
            f"{name:>10}: first chunk p50 {p50 * 1e3:7.2f} ms  p99 {percentile(firsts[name], 99) * 1e3:7.2f} ms  "
            f"({p50 / base:.2f}x vllm)  stream end p50 {statistics.median(ends[name]) * 1e3:7.2f} ms"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--before", metavar="REF", help="also run the API of this git ref, side by side")
    parser.add_argument("--stream-calls", type=int, default=100, help="rounds of the time-to-first-chunk run (0: none)")
    parser.add_argument("--stream-tokens", type=int, default=64, help="tokens a streamed call generates")
    parser.add_argument("--warmup", type=int, default=10, help="rounds before the measured ones (streamed: half)")
    add_backend_option(parser, " (one is used)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-external-agent-"))
    with vllm_urls(args.backend_url, 1, work) as (vllm_url, *_), EmbeddedRedis(data_dir=work / "redis") as redis:
        measure(vllm_url, redis, work, args)


def measure(vllm_url: str, redis: EmbeddedRedis, work: Path, args: argparse.Namespace) -> None:
    """Every path's calls against the vLLM server at `vllm_url`, then the streamed ones; prints both reports."""
    model = tiny_model()
    servers: list[ThreadServer] = []
    apis: list[subprocess.Popen[bytes]] = []
    try:
        client = LLMClient(request_timeout_s=300, max_retries=0)
        sampling = Sampling(max_tokens=args.max_tokens, temperature=0.0, extra={"ignore_eos": True})
        config = LoopConfig(
            max_turns=10**6,
            max_context_tokens=4000,
            max_tokens_per_turn=max(args.max_tokens, args.stream_tokens),
            allowed_tools=DEFAULT_TOOLS,
        )
        session = ExternalAgentSession(
            _load_tokenizer(str(model)),
            get_parser("hermes"),
            lambda ids, s: client.complete(vllm_url, ids, s, "tiny"),
            None,
            config,
            sampling,
            "tiny",
            generate_stream=lambda ids, s, on_tokens: client.stream(vllm_url, ids, s, on_tokens, "tiny"),
        )
        api_url = f"http://127.0.0.1:{free_port()}"
        env = {
            **os.environ,
            "ROLLOUTS_REDIS_URL": redis.url,
            "ROLLOUTS_STATE_DIR": str(work / "state"),
            "ROLLOUTS_EXTERNAL_AGENT_SECRET": SECRET,
            "ROLLOUTS_LOG_LEVEL": "WARNING",
        }
        api_urls: dict[str, tuple[str, Path]] = {"api": (api_url, ROOT)}
        if args.before:  # the same API at another version, from a tree of its own
            before = export_ref(args.before, work / "before")
            api_urls[f"api@{args.before}"] = (f"http://127.0.0.1:{free_port()}", before)
        for url, source in api_urls.values():
            apis.append(
                subprocess.Popen(
                    [sys.executable, "-m", "cli", "api", "--port", url.rsplit(":", 1)[1]],
                    env=env,
                    cwd=source,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        http = httpx.Client(timeout=300)
        for url, _ in api_urls.values():
            _wait_healthy(http, url)
        submitted = http.post(
            f"{api_url}/v1/jobs",
            json={"task": {"kind": "math", "problem": "17 * 23?", "answer": "391"}, "agent": "external"},
        ).json()
        job_id = submitted["job_ids"][0]
        worker = endpoint_server(build_app(session, job_id, SECRET.encode(), dict), "127.0.0.1").start()
        servers.append(worker)
        from redis import Redis

        with Redis.from_url(redis.url) as r:  # as the rollout stage's take and registration leave the record
            r.hset(Keys().job(job_id), "status", "rollout")
            r.set(Keys().external_agent_endpoint(job_id), worker.url)
        # every call is the same fresh conversation: named, each opens a new segment of it (a full prompt render,
        # the dearer case) instead of a conversation of its own, which the job's conversation cap would refuse
        key = {
            "Authorization": f"Bearer {job_token(SECRET.encode(), job_id)}",
            "x-rollouts-conversation": "bench",
        }
        body = {
            "model": "tiny",
            "messages": MESSAGES,
            "max_tokens": args.max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": True,
        }
        renderer = ChatRenderer(session.tokenizer)
        prompt = renderer.prompt(renderer.prepare(MESSAGES)).token_ids
        targets = {
            "vllm": (f"{vllm_url}/v1/chat/completions", {}),
            "generate": ("", {}),
            "worker": (f"{worker.url}/v1/chat/completions", key),
            **{name: (f"{url}/v1/jobs/{job_id}/agent/v1/chat/completions", key) for name, (url, _) in api_urls.items()},
        }
        times: dict[str, list[float]] = {name: [] for name in targets}
        names = list(targets)
        for i in range(args.calls + args.warmup):  # the first rounds warm up every path
            for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate: no path always goes first
                url, headers = targets[name]
                t0 = time.perf_counter()
                if name == "generate":
                    generated = len(client.complete(vllm_url, prompt, sampling, "tiny").token_ids)
                else:
                    response = http.post(url, json=body, headers=headers)
                    response.raise_for_status()
                    generated = response.json()["usage"]["completion_tokens"]
                elapsed = time.perf_counter() - t0
                assert generated == args.max_tokens, (name, generated)
                if i >= args.warmup:
                    times[name].append(elapsed)
        base = statistics.median(times["vllm"])
        print(f"{args.calls} calls each, {args.max_tokens} tokens a call, round-robin")
        for name in names:
            p50 = statistics.median(times[name])
            print(
                f"{name:>10}: p50 {p50 * 1e3:7.2f} ms  p90 {percentile(times[name], 90) * 1e3:7.2f} ms  "
                f"p50 - vllm {(p50 - base) * 1e3:+6.2f} ms"
            )
        if args.stream_calls:
            streamed = {name: target for name, target in targets.items() if name != "generate"}
            first_chunks(
                http, streamed, {**body, "max_tokens": args.stream_tokens}, args.stream_calls, args.warmup // 2
            )
    finally:
        for server in servers:
            server.stop()
        for api in apis:
            api.terminate()
            api.wait(timeout=10)


if __name__ == "__main__":
    main()
