"""Every benchmark that drives vLLM runs at its smallest size against the session's server (`--backend-url`).

None starts a server of its own: each gets the suite's `vllm_server` (the tiny model, served as `tiny`)
and leaves it as it found it. bench.weight_update, which changes its servers' weights, is tested against
test doubles in test_bench_smoke.py instead. Each test checks the report's lines, never a figure's value.
"""

from __future__ import annotations

import pytest

from cli.vllm_server import VLLMServer
from tests.bench.smoke import lines_with, run_bench


def test_external_agent_endpoint(capsys: pytest.CaptureFixture[str], vllm_server: VLLMServer) -> None:
    """Several calls, plain and streamed, to one job's endpoint: each repeats the named conversation's first
    call (the run that stopped with 409 Conflict when every call opened a conversation of its own)."""
    out = run_bench(
        capsys, "external_agent_endpoint", "--calls", "2", "--stream-calls", "2", "--stream-tokens", "8",
        "--warmup", "2", "--backend-url", vllm_server.url,
    )  # fmt: skip
    for path in ("vllm", "generate", "worker", "api"):
        lines_with(out, rf"^ *{path}: p50 +{{n}} ms  p90 +{{n}} ms  p50 - vllm +{{n}} ms$")
    for path in ("vllm", "worker", "api"):
        lines_with(out, rf"^ *{path}: first chunk p50 +{{n}} ms  p99 +{{n}} ms  \({{n}}x vllm\)  stream end p50")


def test_engine_limit(capsys: pytest.CaptureFixture[str], vllm_server: VLLMServer) -> None:
    """Both sides run (vLLM's own serving benchmark from vLLM's environment) on equal prompt and output tokens."""
    out = run_bench(
        capsys, "engine_limit", "--jobs", "2", "--concurrency", "2", "--rounds", "2", "--max-tokens", "4",
        "--backend-url", vllm_server.url,
    )  # fmt: skip
    rows = lines_with(
        out, r"^ +2 \| +[01] \| +{n} \| +{n} \| +{n}x \| +{n} / {n} +\| +{n} / {n} +\(2 requests\) \| +{n}$"
    )
    assert len(rows) == 2
    service_tokens, alone_tokens = rows[0].split("|")[5:7]  # round 0: vLLM alone runs on the service's jobs
    assert service_tokens.split() == alone_tokens.split()[:3], "the same prompt and output tokens on both sides"


def test_gateway(capsys: pytest.CaptureFixture[str], vllm_server: VLLMServer) -> None:
    out = run_bench(
        capsys, "gateway", "--calls", "2", "--rollouts", "2", "--turns", "2", "--rounds", "1",
        "--backend-url", vllm_server.url,
    )  # fmt: skip
    assert len(lines_with(out, r"^ +gateway: p50 +{n} ms  p99 +{n} ms  p50 - direct +{n} ms$")) == 2  # vLLM, proxy
    assert len(lines_with(out, r"^  gateway process CPU per call: {n} ms$")) == 2
    lines_with(out, r"^ +gateway: +{n} calls/s \({n}\)$")
    lines_with(out, r"^  gateway / direct: {n}$")


def test_prefix_cache(capsys: pytest.CaptureFixture[str], vllm_server: VLLMServer) -> None:
    """With one server both routings land on it: the report's shape is what is checked, not the comparison."""
    out = run_bench(
        capsys, "prefix_cache", "--trajectories", "2", "--turns", "2", "--system-tokens", "32",
        "--observation-tokens", "8", "--gen-tokens", "2", "--rounds", "1", "--backend-url", vllm_server.url,
    )  # fmt: skip
    for routing in ("random routing", "sticky \\(pool\\)"):
        lines_with(out, rf"^\| {routing} \| {{n}} \| {{n}} \| {{n}} \| {{n}}% \|$")


def test_service_vs_direct(capsys: pytest.CaptureFixture[str], vllm_server: VLLMServer) -> None:
    out = run_bench(
        capsys, "service_vs_direct", "--jobs", "2", "--turns", "1", "--concurrency", "2",
        "--backend-url", vllm_server.url,
    )  # fmt: skip
    lines_with(out, r"^ +2 \| +{n} \| +{n} \| +{n} \| +{n} \| {n}x$")


def test_stack_faults(capsys: pytest.CaptureFixture[str], vllm_server: VLLMServer) -> None:
    """The one round that leaves the shared server alone and restarts fastest: the embedded Redis SIGKILLed
    under 4 jobs; the vLLM rounds and the weight update need a server of the bench's own (not run here)."""
    out = run_bench(
        capsys, "stack_faults", "--rounds", "redis", "--no-update", "--jobs", "4", "--backend-url", vllm_server.url
    )
    lines_with(out, r"^\| redis \| - \| {n} \| [^|]*\b\d+ done\b[^|]* \| {n} \| {n} \|")


def test_chaos(capsys: pytest.CaptureFixture[str], vllm_server: VLLMServer) -> None:
    """A minute of the chaos run on the kinds that leave the shared server alone (a worker, the API):
    each kill is back in the table, and every job streamed ended done, once, none lost."""
    out = run_bench(
        capsys, "chaos", "--hours", "0.012", "--every", "12", "--in-flight", "4", "--kinds", "rollout,api",
        "--window", "20", "--no-plot", "--backend-url", vllm_server.url,
    )  # fmt: skip
    lines_with(out, r"^{n} jobs submitted under {n} keys in {n} h; ended \{'done': {n}\}$")
    lines_with(out, r"^lost: 0; ids given for two submissions: 0$")
    lines_with(out, r"^jobs Redis held that the client was never given: 0 \(of [1-9]\d* seen there\)$")
    lines_with(out, r"^ends Redis published: [1-9]\d* for [1-9]\d* jobs; jobs that ended twice: 0$")
    lines_with(out, r"^\| 1 \| (rollout|api) \| {n} \| {n} \|$")
    lines_with(out, r"^\| 0\.0 \| {n} \| ({n}|-) \| ({n}|-) \| ({n}|-) \|")  # '-': no job ended in it (a busy machine)
