"""The `rollouts` command as a user runs it: `run`, and `up` + `submit` + `status` + Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

import httpx
import pytest

from cli.embedded_redis import free_port
from tests.support.waiting import responds, wait_for

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS = [sys.executable, "-m", "cli"]


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTS_")}
    env.update(ROLLOUTS_STATE_DIR=str(tmp_path / "state"), **extra)
    return env


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_run_takes_a_batch_through_a_fresh_stack_and_summarises_it(tmp_path):
    out = tmp_path / "results.jsonl"
    result = subprocess.run(
        [*ROLLOUTS, "run", str(ROOT / "examples" / "demo.jsonl"), "--output", str(out)],
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("demo"))
    assert row.split()[:5] == ["demo", "24", "24", "0", "1.000"]
    assert len(out.read_text().splitlines()) == 24


@pytest.mark.vllm
def test_up_serves_a_real_vllm_submit_and_status_and_stops_everything_on_ctrl_c(tmp_path):
    """The embedded default as a user starts it: vLLM on the tiny model (built offline), registered as an
    operator would, the workers, `submit` and `status` against it, and Ctrl-C stopping every process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "up.log", "w") as log:  # a file, not a pipe: the children log into it too
        up = subprocess.Popen(
            [*ROLLOUTS, "up", "--port", str(port)],
            env=cli_env(tmp_path),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def registered() -> list[dict]:
            try:
                return [b for b in httpx.get(f"{url}/v1/backends", timeout=2).json()["backends"] if b["healthy"]]
            except (httpx.HTTPError, KeyError, ValueError):
                return []

        # vLLM starts first (70-80 s cold on a busy machine), then the workers: caps for hangs, not goals.
        [backend] = wait_for(registered, timeout=900, interval=1.0, what="vLLM to start and register")
        assert backend["model"].startswith("tiny-chatml") and backend["tokenizer"].endswith(backend["model"])
        assert httpx.get(f"{backend['url']}/v1/models", timeout=5).json()["data"][0]["id"] == backend["model"]
        wait_for(
            lambda: len(children_of(up.pid)) >= 6,
            timeout=900,
            interval=1.0,
            what="redis, the API, vLLM and three workers",
        )
        wait_for(lambda: "rollouts up: API" in (tmp_path / "up.log").read_text(), timeout=300, what="the banner")

        submitted = subprocess.run(
            [*ROLLOUTS, "submit", str(ROOT / "examples" / "demo.jsonl"), "--url", url],
            env=cli_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            check=False,
        )
        assert submitted.returncode == 0, submitted.stderr
        assert any(line.split()[:3] == ["demo", "24", "24"] for line in submitted.stdout.splitlines())

        status = subprocess.run(
            [*ROLLOUTS, "status", "--url", url],
            env=cli_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        assert "rollout" in status.stdout and "done 24" in status.stdout
        assert "redis: " in status.stdout and "results: " in status.stdout and "UNHEALTHY" not in status.stdout

        everything = descendants_of(up.pid)
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=120) == 0, (tmp_path / "up.log").read_text()[-3000:]
        assert not [pid for pid in everything if alive(pid)], "`up` left processes (vLLM's engine?) behind"
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, "the API still listens"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    output = (tmp_path / "up.log").read_text()
    assert "vLLM ready at" in output, output[-2000:]


def test_submit_reports_a_bad_file_clearly(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": {"kind": "demo", "text": "ok"}}\n{not json\n')
    result = subprocess.run(
        [*ROLLOUTS, "submit", str(bad), "--url", "http://127.0.0.1:9"],
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 1
    assert f"{bad}:2: not valid JSON" in result.stderr


def start_up_without_backend(
    tmp_path: Path, port: int, *args: str, preexec_fn=None
) -> tuple[subprocess.Popen, IO[str]]:
    """`rollouts up` with its output in a file; returns once Redis, the API and three workers run."""
    log = open(tmp_path / "up.log", "w")  # noqa: SIM115 - returned: the caller closes it
    up = subprocess.Popen(
        [*ROLLOUTS, "up", "--port", str(port), "--no-vllm", *args],
        env=cli_env(tmp_path),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=preexec_fn,  # noqa: PLW1509 - sets SIGINT's disposition only
    )
    wait_for(lambda: len(children_of(up.pid)) >= 5, timeout=60, what="redis, the API and three workers")
    return up, log


@pytest.mark.parametrize(
    ("sig", "inherited_ignore"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["sigterm", "ctrl_c_when_started_with_sigint_ignored"],  # `rollouts up &` from a script ignores SIGINT
)
def test_up_stops_everything_on_a_signal(tmp_path, sig, inherited_ignore):
    port = free_port()
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if inherited_ignore else None
    up, log = start_up_without_backend(tmp_path, port, preexec_fn=ignore)
    try:
        wait_for(lambda: responds(f"http://127.0.0.1:{port}/healthz"), what="the API")
        children = children_of(up.pid)
        up.send_signal(sig)
        up.wait(timeout=90)
        assert not [pid for pid in children if alive(pid)], "`up` left processes behind"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        log.close()


def test_children_of_a_killed_up_do_not_outlive_it(tmp_path):
    up, log = start_up_without_backend(tmp_path, free_port())
    try:
        children = children_of(up.pid)
        up.kill()  # no chance to clean up: the children's parent-death signal must stop them
        up.wait()
        wait_for(lambda: not [pid for pid in children if alive(pid)], timeout=60, what="the orphans to exit")
    finally:
        log.close()


def descendants_of(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        children = children_of(frontier.pop())
        found += children
        frontier += children
    return found


def test_up_with_a_backend_url_that_does_not_answer_exits_naming_it(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [*ROLLOUTS, "up", "--port", str(free_port()), "--backend-url", dead],
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode != 0
    assert dead in result.stderr and "/v1/models" in result.stderr


def test_up_with_a_model_dir_that_is_not_a_model_exits_with_the_reason(tmp_path):
    not_a_model = tmp_path / "empty-dir"
    not_a_model.mkdir()
    result = subprocess.run(
        [*ROLLOUTS, "up", "--port", str(free_port()), "--model", str(not_a_model)],
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode != 0
    assert str(not_a_model) in result.stderr and "config.json" in result.stderr


def _worker_pids(up_pid: int) -> list[int]:
    pids = []
    for pid in children_of(up_pid):
        try:
            if b"workers." in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            continue
    return pids


def test_up_restarts_workers_that_die_and_every_job_ends_done(tmp_path):
    port = free_port()
    up, log = start_up_without_backend(tmp_path, port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: responds(f"{url}/healthz"), what="the API")
        jobs = [{"task": {"kind": "demo", "text": f"job {n}", "work_s": 0.3}} for n in range(100)]
        ids = httpx.post(f"{url}/v1/jobs", json=jobs, timeout=30).json()["job_ids"]
        killed = []
        for _ in range(5):  # five SIGKILLs, spread over the run, of whichever worker process is there
            victim = wait_for(lambda: _worker_pids(up.pid), timeout=60, what="a worker process")[0]
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
            wait_for(
                lambda victim=victim: victim not in _worker_pids(up.pid) and len(_worker_pids(up.pid)) == 3,
                timeout=120,
                interval=0.5,
                what="the killed worker to be replaced",
            )

        def all_done() -> bool:
            rows = httpx.get(f"{url}/v1/jobs", params={"ids": ",".join(ids)}, timeout=30).json()["jobs"]
            return len(rows) == 100 and all(row["status"] in ("done", "failed") for row in rows)

        wait_for(all_done, timeout=600, interval=1.0, what="the 100 jobs to end")
        rows = httpx.get(f"{url}/v1/jobs", params={"ids": ",".join(ids)}, timeout=30).json()["jobs"]
        assert {row["status"] for row in rows} == {"done"}
        assert up.poll() is None, "one dead worker stopped the whole stack"
        text = (tmp_path / "up.log").read_text()
        assert all(f"(pid {pid}) exited with signal SIGKILL" in text for pid in killed), text[-3000:]
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        log.close()


def _run_demo_jobs(url: str, n: int) -> None:
    jobs = [{"task": {"kind": "demo", "text": f"job {i}"}} for i in range(n)]
    ids = httpx.post(f"{url}/v1/jobs", json=jobs, timeout=30).json()["job_ids"]

    def done() -> bool:
        rows = httpx.get(f"{url}/v1/jobs", params={"ids": ",".join(ids)}, timeout=30).json()["jobs"]
        return all(row["status"] == "done" for row in rows)

    wait_for(done, timeout=300, interval=0.5, what=f"{n} demo jobs")


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_up_prints_where_everything_is_and_keeps_rq_quiet_unless_asked(tmp_path, verbose):
    port = free_port()
    up, log = start_up_without_backend(tmp_path, port, *(["--verbose"] if verbose else []))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: responds(f"{url}/healthz"), what="the API")
        _run_demo_jobs(url, 20)
        up.send_signal(signal.SIGINT)
        up.wait(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        log.close()
    text = (tmp_path / "up.log").read_text()
    url_file = tmp_path / "state" / "redis.url"
    for line in (
        f"rollouts up: API {url}",
        f"viewer    {url}/viewer",
        f"docs      {url}/docs",
        f"its URL with the password is in {url_file}",
        "rollouts dashboard",
    ):
        assert line in text, text[:2000]
    rq_lines = [line for line in text.splitlines() if " rq." in line or "Job OK" in line]
    if verbose:
        assert len(rq_lines) >= 20, "--verbose should show rq's per-job lines"
    else:
        assert rq_lines == [], rq_lines[:5]


class _NeverReadyBackend(BaseHTTPRequestHandler):
    """Test double of an LLM backend that lists a model and is never healthy (fault injection: `up`
    waits for it in the pool, so its start-up is held until the test interrupts it)."""

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "never-ready", "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(503)

    def log_message(self, *args: object) -> None:
        pass


def test_ctrl_c_while_up_starts_stops_what_started_and_exits_cleanly(tmp_path):
    """Ctrl-C before the stack is up (here: waiting for a backend to turn healthy): `up` stops what it
    had started and exits 0 saying so, not click's "Aborted!" with exit 1."""
    backend = ThreadingHTTPServer(("127.0.0.1", 0), _NeverReadyBackend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    port = free_port()
    with open(tmp_path / "up.log", "w") as log:
        up = subprocess.Popen(
            [
                *ROLLOUTS,
                "up",
                "--port",
                str(port),
                "--no-vllm",
                "--backend-url",
                f"http://127.0.0.1:{backend.server_port}",
            ],
            env=cli_env(tmp_path),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def registrar() -> list[int]:
            return [pid for pid in children_of(up.pid) if b"register" in Path(f"/proc/{pid}/cmdline").read_bytes()]

        wait_for(registrar, timeout=120, what="`up` to wait for its backend (the registrar runs)")
        children = children_of(up.pid)
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=90) == 0, (tmp_path / "up.log").read_text()[-3000:]
        output = (tmp_path / "up.log").read_text()
        assert "stopped before the stack was up" in output and "Aborted" not in output
        assert not [pid for pid in children if alive(pid)], "`up` left processes behind"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        backend.shutdown()
