"""`rollouts up` keeps the run going when one of its processes dies (issue 36), on a real vLLM server.

One stack for the module, started as `rollouts up` starts it: Stack(vllm=True, persistent_redis=True)
with its supervise() on a thread. The tests kill, in order: the API process and the embedded Redis
(jobs submitted afterwards run to done); vLLM's engine (EngineCore, found in the vLLM server's
process group) while jobs are held in it, after a weight update (every job ends done, the backend
comes back with the updated weights, checked by logprobs against transformers); vLLM's API server
process; vLLM's API server stopped (SIGSTOP: alive, silent), which the stack's hang watch kills and
restarts; then every restart shows in GET /v1/status. Jobs are held by mechanism: the server's scheduler is paused with vLLM's own
/pause?mode=keep and the kill comes once its log shows it took every job's request. Each test reports
the time from its kill to serving again (figures, never asserted).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from cli.vllm_server import VLLMServer
from shared.config import Settings
from tests.support.vllm_processes import vllm_process
from tests.support.vllm_server import SERVED_NAME, TEST_VLLM_ARGS, freeze, requests_taken
from tests.support.waiting import TERMINAL, client_for, job, wait_for
from tests.support.weight_checks import checkpoint, gap_to, sample

pytestmark = pytest.mark.vllm

ENV = {
    "ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds",
    "ROLLOUTS_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_MAINTENANCE_INTERVAL_S": "2",
    "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "1",
}
# Generous caps on waiting for events (a vLLM restart on 2 busy cores is 30-120 s); never asserted as speeds.
RESTART_CAP_S = 600.0
# A serving vLLM answers /health within a second or two even on busy cores; half a minute of silence is a hang
# (the watch probes every 5 s: six probes in a row unanswered).
HANG_AFTER_S = 30.0


@dataclass
class Up:
    stack: Stack
    api: httpx.Client
    root: Path
    lines: list[tuple[float, str]] = field(default_factory=list)  # the stack's log: (monotonic time, line)

    def log(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def said_since(self, since: float, *words: str) -> float | None:
        """When the stack first logged a line with every one of `words` after `since`."""
        return next((t for t, line in self.lines if t >= since and all(w in line for w in words)), None)

    @property
    def server(self) -> VLLMServer:
        assert self.stack.vllm_server is not None
        return self.stack.vllm_server


@pytest.fixture(scope="module")
def up(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    root = tmp_path_factory.mktemp("up")
    settings = Settings(
        redis_url=None,
        state_dir=root / "state",
        vllm_served_model_name=SERVED_NAME,
        vllm_args=" ".join([*TEST_VLLM_ARGS, "--max-model-len", "4096", "--enable-log-requests"]),
        vllm_hang_timeout_s=HANG_AFTER_S,
    )
    lines: list[tuple[float, str]] = []

    def progress(line: str) -> None:
        lines.append((time.monotonic(), line))
        print(f"[stack] {line}", flush=True)

    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": 1, "rollout": 4, "eval": 1},
        log_dir=root / "logs",
        persistent_redis=True,
        vllm=True,
        model=tiny_model,
        on_progress=progress,
        extra_env=ENV,
        drain_timeout_s=5,
    )
    stack.start()
    supervisor = threading.Thread(target=stack.supervise, name="supervise", daemon=True)
    try:
        stack.wait_for_workers()
        supervisor.start()
        with client_for(stack) as api:
            yield Up(stack, api, root, lines)
    finally:
        stack.stop(timeout=20)
        supervisor.join(timeout=30)


def submit(api: httpx.Client, n: int, seed: int) -> list[str]:
    jobs = [
        {
            "task": {
                "kind": "agent-answer",
                "problem": f"What is {i} + {i}?",
                "answer": str(2 * i),
                "stop_on_no_tool_call": False,
            },
            "limits": {"max_turns": 2, "max_tokens": 3000},
            "sampling": {"max_tokens": 16, "temperature": 1.0, "seed": seed + i},
        }
        for i in range(n)
    ]
    response = api.post("/v1/jobs", json=jobs)
    assert response.status_code == 202, response.text
    return response.json()["job_ids"]


def finished(api: httpx.Client, ids: list[str]) -> list[dict[str, Any]]:
    """Every job's record once all are terminal (a look that fails while the API restarts is a no)."""

    def all_terminal() -> list[dict[str, Any]] | None:
        try:
            records = [job(api, i) for i in ids]
        except httpx.HTTPError:
            return None
        return records if all(r["status"] in TERMINAL for r in records) else None

    return wait_for(all_terminal, timeout=RESTART_CAP_S, interval=1.0, what=f"jobs {ids} to end")


def assert_all_done(records: list[dict[str, Any]], up: Up) -> None:
    for record in records:
        assert record["status"] == "done", (record, up.log())
        assert record["result"]["reward"] in (0.0, 1.0), (record, up.log())


def backend_serving(up: Up) -> dict[str, Any] | None:
    """The stack's vLLM backend as the pool lists it, once registered, healthy and open to new pins."""
    try:
        backends = up.api.get("/v1/backends").json()["backends"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    mine = [b for b in backends if b["url"] == up.server.url.rstrip("/")]
    return mine[0] if mine and mine[0]["healthy"] and not mine[0]["draining"] else None


def healthz(up: Up) -> dict[str, Any] | None:
    """/healthz's body when the API answers and reaches Redis."""
    try:
        response = up.api.get("/healthz")
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def registrar_log(up: Up) -> str:
    """What the stack's vLLM's registrars said (`rollouts register`: "registered ...", "deregistered ...")."""
    assert up.stack.log_dir is not None and up.stack._vllm_slot is not None
    return (up.stack.log_dir / f"register-{up.stack._vllm_slot}.log").read_text()


def test_a_killed_api_and_a_killed_redis_are_restarted_and_jobs_run_to_done(up: Up, figure) -> None:
    stack = up.stack
    assert stack.api is not None and stack.redis is not None and stack.redis.process is not None
    port, api_pid = stack.api_port, stack.api.pid
    killed = time.monotonic()
    os.kill(api_pid, signal.SIGKILL)
    wait_for(
        lambda: stack.api is not None and stack.api.pid != api_pid and healthz(up),
        timeout=RESTART_CAP_S,
        what="the API to be restarted",
    )
    api_back = time.monotonic() - killed
    assert stack.api_port == port and up.said_since(killed, "the API", "exited with signal SIGKILL"), up.log()

    redis_pid = stack.redis.process.pid
    killed = time.monotonic()
    os.kill(redis_pid, signal.SIGKILL)
    wait_for(
        lambda: up.said_since(killed, "the embedded Redis", "restarted"),
        timeout=RESTART_CAP_S,
        what="the embedded Redis to be restarted",
    )
    wait_for(lambda: healthz(up), timeout=RESTART_CAP_S, what="/healthz to reach Redis again")
    redis_back = time.monotonic() - killed
    assert stack.redis.process.pid != redis_pid, up.log()
    assert up.said_since(killed, "the embedded Redis", "exited with signal SIGKILL"), up.log()

    backend = wait_for(lambda: backend_serving(up), timeout=RESTART_CAP_S, what="the backend, still registered")
    records = finished(up.api, submit(up.api, 3, seed=100))
    assert_all_done(records, up)
    figure(
        f"API SIGKILLed: serving again (/healthz 200) {api_back:.1f} s after the kill; embedded Redis "
        f"SIGKILLed: restarted from its AOF, /healthz 200 {redis_back:.1f} s after; backend {backend['id']} "
        "still registered; 3 jobs submitted afterwards all done"
    )


def test_a_killed_engine_comes_back_with_the_current_weights_and_every_job_ends_done(up: Up, figure) -> None:
    server, root = up.server, up.root
    updated = checkpoint(root, 1)
    response = up.api.post(
        f"/v1/models/{SERVED_NAME}/weights", json={"version": "step-1", "path": str(updated)}, timeout=600
    )
    assert response.status_code == 200 and all(b["status"] == "updated" for b in response.json()["backends"]), (
        response.text
    )

    freeze(server)  # every request from now on waits in the engine, unsampled
    taken = requests_taken(server)
    ids = submit(up.api, 3, seed=200)
    wait_for(
        lambda: requests_taken(server) >= taken + 3,
        timeout=RESTART_CAP_S,
        interval=0.5,
        what="the engine to take every job's first request",
    )
    engine = vllm_process(server, b"EngineCore")
    killed = time.monotonic()
    os.kill(engine, signal.SIGKILL)

    records = finished(up.api, ids)
    assert_all_done(records, up)
    wait_for(lambda: backend_serving(up), timeout=RESTART_CAP_S, what="the backend to serve again")
    restarted = up.said_since(killed, "vLLM", "restarted", "step-1")
    left = up.said_since(killed, "vLLM", "exited with")
    assert left is not None and restarted is not None, up.log()
    # it left the pool before it came back: its registrar deregistered it, then a new one registered it
    said = registrar_log(up).splitlines()
    last_out = max((i for i, line in enumerate(said) if line.startswith("deregistered ")), default=None)
    assert last_out is not None and said[-1].startswith("registered ") and last_out < len(said) - 1, said
    for record in records:  # every token was sampled after the restart, by the updated weights
        turns = [t for t in record["result"]["trajectory"]["turns"] if t["role"] == "assistant"]
        assert turns and all(t["policy_version"] == "step-1" for t in turns), (record, up.log())

    info = httpx.get(f"{server.url}/weight_info", timeout=30).json()
    assert info["weight_version"] == "step-1", info
    tokens, logprobs = sample(server.url, seed=7)
    gap, control = gap_to(updated, tokens, logprobs), gap_to(server.model, tokens, logprobs)
    assert gap < 1e-3 and control > 1e-2, (gap, control, tokens, logprobs)
    figure(
        f"EngineCore SIGKILLed with 3 jobs in it after update step-1: vLLM exited {left - killed:.1f} s after "
        f"the kill, back in the pool with step-1 {restarted - killed:.1f} s after (logprob gap to step-1 "
        f"{gap:.1e}, to the base weights {control:.2f}); all 3 jobs done"
    )


def test_a_killed_vllm_api_server_comes_back_with_the_current_weights(up: Up, figure) -> None:
    server = up.server
    wait_for(lambda: backend_serving(up), timeout=RESTART_CAP_S, what="the backend to serve")
    api_server = vllm_process(server, b"vllm.entrypoints.openai.api_server")
    killed = time.monotonic()
    os.kill(api_server, signal.SIGKILL)
    wait_for(lambda: up.said_since(killed, "vLLM", "restarted"), timeout=RESTART_CAP_S, what="vLLM's restart")
    backend = wait_for(lambda: backend_serving(up), timeout=RESTART_CAP_S, what="the backend to serve again")
    back = time.monotonic() - killed
    info = httpx.get(f"{server.url}/weight_info", timeout=30).json()
    assert info["weight_version"] == "step-1", (info, up.log())
    records = finished(up.api, submit(up.api, 2, seed=300))
    assert_all_done(records, up)
    figure(
        f"vLLM's API server SIGKILLed: back in the pool ({backend['id']}) with step-1 {back:.1f} s after the "
        "kill; 2 jobs submitted afterwards done"
    )


def test_a_hung_vllm_is_killed_and_comes_back_with_the_current_weights(up: Up, figure) -> None:
    """SIGSTOP of vLLM's API server: alive, holding its port, answering nothing. The stack's hang watch
    (cli/hang_watch.py) kills it once /health has been silent for vllm_hang_timeout_s, and it restarts
    as a dead one does: out of the pool at once, back with the current weights."""
    server = up.server
    wait_for(lambda: backend_serving(up), timeout=RESTART_CAP_S, what="the backend to serve")
    api_server = vllm_process(server, b"vllm.entrypoints.openai.api_server")
    stopped = time.monotonic()
    os.kill(api_server, signal.SIGSTOP)
    wait_for(
        lambda: up.said_since(stopped, "vLLM", "has not answered /health", "killing it"),
        timeout=RESTART_CAP_S,
        what="the hang watch to kill the stopped server",
    )
    judged = up.said_since(stopped, "vLLM", "killing it")
    # not before its silence was long enough: it counts from the last answer, at most one probe round (5 s apart,
    # 5 s timeout) before the stop
    assert judged is not None and judged - stopped >= HANG_AFTER_S - 10, up.log()
    wait_for(
        lambda: up.said_since(stopped, "vLLM", "restarted", "step-1"), timeout=RESTART_CAP_S, what="vLLM's restart"
    )
    wait_for(lambda: backend_serving(up), timeout=RESTART_CAP_S, what="the backend to serve again")
    back = time.monotonic() - stopped
    records = finished(up.api, submit(up.api, 2, seed=400))
    assert_all_done(records, up)
    # every restart of the module shows in `rollouts status` (GET /v1/status): API 1, Redis 1, vLLM 3
    restarts = up.api.get("/v1/status").json()["restarts"]
    assert restarts == {"api": 1, "redis": 1, "vllm": 3}, (restarts, up.log())
    figure(
        f"vLLM's API server SIGSTOPped: judged hung {judged - stopped:.1f} s after (limit {HANG_AFTER_S:.0f} s), "
        f"killed, back in the pool with step-1 {back:.1f} s after the stop; 2 jobs submitted afterwards done"
    )
