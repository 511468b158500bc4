"""Every benchmark without a model runs at its smallest size and prints its report: a bench that rots fails here.

Each test calls `bench.<name>.main` in this process with tiny arguments and checks the report's lines
(a line per path with a number), never a figure's value: the figures are docs/BENCHMARKS.md's business.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from tests.bench.smoke import lines_with, run_bench, skip_without_bwrap
from tests.support.json_backend import JsonBackendHandler


def test_backend_selection(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_bench(capsys, "backend_selection", "--pins", "20", "--threads", "2", "--backends", "1", "2")
    for backends in ("1", "2"):
        for method in ("Lua script", "plain Python"):
            lines_with(out, rf"^\| {backends} \| {method} .*\| {{n}} / {{n}} \| {{n}} \| {{n}} \|$")


def test_dapo(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_bench(
        capsys, "dapo", "--repeats", "1", "--seeds", "2", "--median-s", "0.02", "--sigma", "0.2", "--target", "2",
        "--in-flight", "2",
    )  # fmt: skip
    lines_with(out, r"^simulated, 2 seeds: async mean {n}s, sync mean {n}s")
    lines_with(out, r"^live async: mean {n}s over 1 runs")
    lines_with(out, r"^live sync: mean {n}s over 1 runs")
    lines_with(out, r"^live speed-up per seed: {n}x$")


def test_disk_quota(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_bench(capsys, "disk_quota", "--dirs", "3", "--files", "2", "--rounds", "2")
    lines_with(out, r"^disk_usage walk median {n} ms; du -s median {n} ms; ratio {n}$")
    lines_with(out, r"^watch: a walk every {n} s .*: {n}% of a core per watched sandbox$")


def test_external_agent_hop(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_bench(capsys, "external_agent_hop", "--calls", "3")
    lines_with(out, r"^ +worker: p50 +{n} ms")
    lines_with(out, r"^ +api: p50 +{n} ms  p50 - worker +{n} ms  API CPU per call {n} ms$")


def test_fleet_scaling(capsys: pytest.CaptureFixture[str]) -> None:
    """Two fleet sizes on stand-in turns: a row each, every job done (the bench raises otherwise)."""
    out = run_bench(
        capsys, "fleet_scaling", "--processes", "1", "2", "--slots", "2", "--turn-s", "0.2", "--jobs-per-slot", "3"
    )
    rows = lines_with(out, r"^\| [12] \| [24] \| (6|12) \| {n} \| {n} \| {n} \| {n} \| " + r"{n} \| " * 6 + r"{n} \|$")
    assert [row.split("|")[1].strip() for row in rows[-2:]] == ["1", "2"]


def test_graders(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_bench(capsys, "graders", "--repeats", "1", "--child", "3", "--cases", "30")
    lines_with(out, r"^\| \*\*all\*\* \| \*\*30\*\* \| \*\*{n}\*\* \| \*\*{n}\*\* \| \*\*{n}\*\* \|$")
    for grader in ("old", "new"):
        lines_with(out, rf"^\| {grader} \| {{n}} \|$")
        lines_with(out, rf"^\| {grader}, through equivalent\(\) .* \| {{n}} \|$")


def test_load(capsys: pytest.CaptureFixture[str]) -> None:
    """40 jobs queued, 5 locust users seeing 10 through (locust in its own process): zero failures, all done once."""
    out = run_bench(capsys, "load", "--queued", "40", "--users", "5", "--spawn-rate", "5", "--client-jobs", "10")
    for request in ("submit", "poll", "read"):
        lines_with(out, rf"^\| {request}( \(wait_s={{n}}\))? \| {{n}} \| 0 \| {{n}} \| {{n}} \| {{n}} \|$")
    lines_with(out, r"^jobs: 50 submitted \(40 queued \+ 10 by the clients\), 50 done, 0 lost, 0 duplicated;")
    lines_with(out, r"^redis used_memory: .* per job {n} B queued, {n} B finished$")
    lines_with(out, r"^errors: 0$")


def test_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_bench(capsys, "pipeline", "--jobs", "20", "--rounds", "1", "--slots", "2", "--submits", "5")
    for run in ("bare", "pipeline x2"):
        lines_with(out, rf"^{run} +{{n}} +{{n}} +{{n}}x$")
    lines_with(out, r"^API submit \(one job per POST, 5 requests\): p50 {n} ms, p99 {n} ms$")


def test_redis_memory(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_bench(capsys, "redis_memory", "--jobs", "4", "--warmup", "2", "--tokens", "64", "--slots", "1")
    lines_with(out, r"^results store bytes per job .*: {n}$")
    lines_with(out, r"^redis bytes per finished job: {n}$")


def test_sandbox_pool(capsys: pytest.CaptureFixture[str]) -> None:
    skip_without_bwrap()
    out = run_bench(
        capsys, "sandbox_pool", "--concurrency", "1", "--jobs", "1", "--caps", "1", "--burst", "1", "--memory", "1"
    )
    for mode in ("cold", "single-use", "reuse"):
        lines_with(out, rf"^\| {mode} \| 1 \| 1 \| {{n}} \| {{n}} \| {{n}} \| {{n}} \|$")
    lines_with(out, r"^\| 1 \| {n} \| {n} \| {n} \| {n} \|$")  # the start cap's sweep
    lines_with(out, r"^memory of a ready sandbox .*: median {n} MiB, max {n} MiB$")


def test_sandbox_pool_stack(capsys: pytest.CaptureFixture[str]) -> None:
    """One mode (the pool on, sandboxes reused: the most of it): each mode is a stack of its own, ~14 s."""
    skip_without_bwrap()
    out = run_bench(capsys, "sandbox_pool_stack", "--jobs", "1", "--rollout-concurrency", "1", "--modes", "reuse")
    lines_with(out, r"^\| on, reuse \| 1 \| 1 \| {n} \| {n} \| {n} \|$")


def test_sandbox_burst(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/mixed.jsonl once (8 jobs), the scripted backend, one configuration: one stack, ~20 s."""
    skip_without_bwrap()
    out = run_bench(capsys, "sandbox_burst", "--llm", "scripted", "--repeat", "1", "--configs", "new", "--settle", "0")
    for kind in ("code", "math", "stem", "swe"):
        lines_with(
            out, rf"^\| new \| {{n}} \| {{n}} \| {{n}} \| {kind} \| {{n}} \| {{n}} \| {{n}} \| {{n}}% \| {{n}} \|$"
        )


def test_tools(capsys: pytest.CaptureFixture[str]) -> None:
    skip_without_bwrap()
    out = run_bench(capsys, "tools", "--calls", "2", "--rounds", "1")
    lines_with(out, r"^\| persistent pty bash, sandboxed, via Unix socket \| {n} \| {n} \| {n} \|")
    lines_with(out, r"^\| persistent kernel, ipc, sandboxed, via Unix socket \| {n} \| {n} \| {n} \|")
    lines_with(out, r"^\| the python tool's kernel and client \| {n} \| {n} \|$")
    lines_with(out, r"^\| start \(bwrap \+ tool server \+ shell, until it answers\) \| {n} \|$")
    lines_with(out, r"^\| a later kernel \(a fork: .*\) \| {n} \| {n} \| {n} \| {n}x, {n}x \|$")
    lines_with(out, r"^\| the cell calls os._exit\(1\) \| {n} \| {n} \|$")
    lines_with(out, r"^\| tool server imports .* \| {n} \| {n}x \|$")


def test_trainer_bridges(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.trainers_env import trainers_python

    trainers_python()  # skips (fails in CI) without the trainers' virtualenv, before the stack starts
    out = run_bench(capsys, "trainer_bridges", "--trajectories", "2", "--concurrency", "1")
    for path in ("bridge", "client", "manager", "mgr end"):
        lines_with(out, rf"^{path} +{{n}} +{{n}} +{{n}}$")
    lines_with(out, r"^bridge p50 / client p50: {n}$")


class WeightsDouble:
    """A stand-in for a vLLM server that takes every weight update (each route answers 200 at once).

    bench.weight_update changes its servers' weights, so it must not get the session's vLLM server, and
    two servers of its own cost a minute: against these it runs everything but vLLM's own reload
    (tests/weights/ covers that on real vLLM)."""

    def __init__(self) -> None:
        class Handler(JsonBackendHandler):
            def models_listing(self) -> dict[str, Any]:
                return {"data": [{"id": "tiny", "root": "tiny"}]}

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_json(200, {})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def weights_doubles() -> Iterator[list[WeightsDouble]]:
    doubles = [WeightsDouble(), WeightsDouble()]
    yield doubles
    for double in doubles:
        double.stop()


def test_weight_update(capsys: pytest.CaptureFixture[str], weights_doubles: list[WeightsDouble]) -> None:
    urls = [arg for double in weights_doubles for arg in ("--backend-url", double.url)]
    out = run_bench(capsys, "weight_update", "--rounds", "1", "--bytes", *urls)
    for what in ("save+load", "update 1 backend", "update 2 backends", "bytes 1 backend", "bytes 2 backends"):
        lines_with(out, rf"^{re.escape(what)} +{{n}} +{{n}} +{{n}}$")
    for double in weights_doubles:
        lines_with(out, rf"^  {double.url}: pause {{n}}  reload {{n}}")
