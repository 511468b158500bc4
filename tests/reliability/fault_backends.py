"""LLM backends that fail: one that hangs, and a scripted one in a process of its own to SIGKILL.

`HangingBackend` answers the registration check (`GET /v1/models`) and health probes until the
first generation request arrives, and from then on never answers anything, /health included (a
server that wedged once it took work: the kernel completes the TCP handshake, nobody reads).
Healthy until then, it cannot be probed out of the pool (a maintenance pass runs every few
seconds) before the job's request reaches it, however long the job takes to get there. `ScriptedProcess`
runs tests.support.scripted_llm in a child process that answers the first `serve` requests
and holds every later one, printing `received N` as each arrives, so a test can SIGKILL
it with a request in flight: `python -m tests.reliability.fault_backends MODEL_DIR SCRIPTS_JSON SERVE`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.scripted_llm import SCRIPTED_MODEL, ScriptedLLM
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


class HangingBackend:
    """Answers GET /v1/models, and GET /health until a generation request came; accepts every other
    request, reads its head, and holds it open, silent."""

    def __init__(self, model_dir: Path | None = None) -> None:
        self.model_dir = model_dir
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._held: list[socket.socket] = []
        self.requests: list[str] = []  # request lines as they arrive ("POST /v1/completions HTTP/1.1")
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="hanging-backend").start()

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def completions(self) -> int:
        """Generation requests taken so far (the pool's /health probes arrive here too)."""
        return sum(line.startswith(("POST /inference/v1/generate", "POST /v1/completions")) for line in self.requests)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(conn)
            threading.Thread(target=self._read_head, args=(conn,), daemon=True).start()

    def _read_head(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n" not in head:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode(errors="replace")
        self.requests.append(line)
        if line.startswith("GET /v1/models "):
            card = {"id": SCRIPTED_MODEL, "object": "model", "root": str(self.model_dir or "")}
            body = json.dumps({"object": "list", "data": [card]}).encode()
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            conn.close()
        elif line.startswith("GET /health ") and not self.completions():
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            conn.close()

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
        for conn in self._held:
            conn.close()


@dataclass
class ScriptedProcess:
    """A ScriptedLLM in its own process, to be killed for real."""

    process: subprocess.Popen[str]
    url: str
    received: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, model_dir: Path, scripts: dict[str, list[str]], serve: int) -> ScriptedProcess:
        argv = [
            sys.executable,
            "-m",
            "tests.reliability.fault_backends",
            str(model_dir),
            json.dumps(scripts),
            str(serve),
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        first = process.stdout.readline().split()
        assert first[:1] == ["url"], f"the scripted backend did not start: {first}"
        started = cls(process, first[1])
        threading.Thread(target=started._read, daemon=True, name="scripted-process-stdout").start()
        return started

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("received "):
                self.received.append(int(line.split()[1]))

    def wait_received(self, n: int, timeout: float = 60.0) -> None:
        wait_for(lambda: len(self.received) >= n, timeout=timeout, what=f"request {n} to reach the backend")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@dataclass
class _HoldingLLM(ScriptedLLM):
    serve: int = 1_000_000
    _count: int = 0

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._count += 1
            n = self._count
        print(f"received {n}", flush=True)
        if n > self.serve:
            threading.Event().wait()  # held until the process is killed
        return super().complete(body)


def main(model_dir: str, scripts: str, serve: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    llm = _HoldingLLM(tokenizer, scripts=json.loads(scripts), serve=int(serve)).start()
    print(f"url {llm.url}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:4])
