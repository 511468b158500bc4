"""The whole service vs a plain asyncio agent loop, on the same vLLM server and the same jobs.

One vLLM server (the CPU build on the tiny model, as `rollouts up` starts it). The same N
multi-turn jobs (`bench-chat`: `--turns` LLM turns each, a nudge between turns, seeded
sampling) run twice per concurrency level:

- **direct**: a plain asyncio loop in this process: render the prompt with the model's chat
  template, POST /inference/v1/generate, append the reply and the nudge's template tokens, repeat;
  `concurrency` trajectories at a time (an asyncio semaphore);
- **service**: the jobs go through the HTTP API, Redis queues, init -> rollout -> eval worker
  processes (rollout concurrency = `concurrency`), the backend pool and the stage runner, and are
  followed by polling, as a trainer would.

Reports jobs/s and generated tokens/s of each and the ratio service / direct.

    .venv/bin/python -m bench.service_vs_direct [--jobs 64] [--turns 4] [--concurrency 1 8 32 64]
        [--backend-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.backends import add_backend_option, tiny_model, vllm_urls
from bench.chat_kind import BenchChatKind, bench_messages
from cli.stack import Stack
from shared.config import Settings
from workers.rollout.chat_delta import ChatRenderer, tool_instructions_json
from workers.rollout.llm_completion import Sampling
from workers.rollout.llm_services import _load_tokenizer
from workers.rollout.llm_wire import generate_body
from workers.rollout.tool_parsers import get_parser

NUDGE = Settings().agent_no_tool_call_message
MAX_TOKENS = 64


def jobs(n: int, turns: int) -> list[dict[str, Any]]:
    return [
        {
            "task": {"kind": "bench-chat", "prompt": f"What is {i} times {i + 1}?", "stop_on_no_tool_call": False},
            "limits": {"max_turns": turns, "max_tokens": 4000},
            "sampling": {"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 1000 + i},
        }
        for i in range(n)
    ]


async def direct_episode(http: httpx.AsyncClient, url: str, renderer: ChatRenderer, job: dict[str, Any]) -> int:
    """One trajectory as a hand-written loop would run it; returns its generated token count."""
    tokens = list(renderer.prompt(renderer.prepare(bench_messages(job["task"]))).token_ids)
    sampling = Sampling(max_tokens=MAX_TOKENS, seed=job["sampling"]["seed"])
    generated = 0
    for turn in range(job["limits"]["max_turns"]):
        response = await http.post(f"{url}/inference/v1/generate", json=generate_body(tokens, sampling, "tiny"))
        response.raise_for_status()
        choice = response.json()["choices"][0]
        ids = choice["token_ids"]
        tokens += ids
        generated += len(ids)
        if turn + 1 == job["limits"]["max_turns"]:
            break
        ends_on_eos = choice["finish_reason"] == "stop" and choice["stop_reason"] is None
        _content, stop_text = renderer.split_generation(ids, ends_on_eos)
        nudge = [{"role": "user", "content": NUDGE}]
        tokens += renderer.observation(stop_text, nudge).token_ids
    return generated


async def run_direct(
    url: str, renderer: ChatRenderer, batch: list[dict[str, Any]], concurrency: int
) -> tuple[float, int]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency + 4)) as http:

        async def one(job: dict[str, Any]) -> int:
            async with limit:
                return await direct_episode(http, url, renderer, job)

        started = time.perf_counter()
        counts = await asyncio.gather(*(one(job) for job in batch))
    return time.perf_counter() - started, sum(counts)


def run_service(api_url: str, batch: list[dict[str, Any]]) -> tuple[float, int]:
    with httpx.Client(base_url=api_url, timeout=60) as api:
        started = time.perf_counter()
        ids = api.post("/v1/jobs", json=batch).json()["job_ids"]
        pending, generated = set(ids), 0
        while pending:
            for job_id in list(pending):
                record = api.get(f"/v1/jobs/{job_id}").json()
                if record["status"] in ("done", "failed", "cancelled", "timed_out"):
                    if record["status"] != "done":
                        raise RuntimeError(f"job {job_id} ended {record['status']}: {record.get('error')}")
                    generated += record["result"]["trajectory"]["counts"]["generated_tokens"]
                    pending.discard(job_id)
            time.sleep(0.05)
        return time.perf_counter() - started, generated


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    add_backend_option(parser, " (one is used)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-svd-"))
    hermes = get_parser("hermes")
    schemas = BenchChatKind().tool_schemas()
    renderer = ChatRenderer(
        _load_tokenizer(str(tiny_model())), schemas, tool_instructions_json(schemas, hermes.call_format)
    )
    with vllm_urls(args.backend_url, 1, work) as (url, *_):
        print(
            f"{'concurrency':>11} | {'direct jobs/s':>13} | {'service jobs/s':>14} | {'direct tok/s':>12} | "
            f"{'service tok/s':>13} | service / direct"
        )
        for concurrency in args.concurrency:
            d_s, d_tokens, s_s, s_tokens = side_by_side(url, renderer, jobs(args.jobs, args.turns), concurrency, work)
            ratio = (args.jobs / s_s) / (args.jobs / d_s)
            print(
                f"{concurrency:>11} | {args.jobs / d_s:>13.2f} | {args.jobs / s_s:>14.2f} | {d_tokens / d_s:>12.0f} | "
                f"{s_tokens / s_s:>13.0f} | {ratio:.2f}x",
                flush=True,
            )


def chat_stack(url: str, concurrency: int, work: Path) -> Stack:
    """A stack (not started) running `bench-chat` jobs on the vLLM server at `url`, `concurrency` rollouts at once."""
    return Stack(
        Settings(redis_url=None, state_dir=work / f"state-{concurrency}"),
        api_port=0,
        concurrency={"init": 8, "rollout": concurrency, "eval": 8},
        log_dir=work / "logs",
        backend_urls=[url],
        extra_env={"ROLLOUTS_TASK_MODULES": "bench.chat_kind", "ROLLOUTS_LOG_LEVEL": "WARNING"},
    )


def side_by_side(
    url: str, renderer: ChatRenderer, batch: list[dict[str, Any]], concurrency: int, work: Path
) -> tuple[float, int, float, int]:
    """(seconds, generated tokens) of the direct loop, then of the service on a stack of its own."""
    stack = chat_stack(url, concurrency, work)
    stack.start()
    try:
        stack.wait_for_workers()
        run_service(stack.api_url, batch[: min(4, len(batch))])  # warm: imports, sandboxless kind, pins
        d_s, d_tokens = asyncio.run(run_direct(url, renderer, batch, concurrency))
        s_s, s_tokens = run_service(stack.api_url, batch)
    finally:
        stack.stop()
    return d_s, d_tokens, s_s, s_tokens


if __name__ == "__main__":
    main()
