"""Start a private redis-server on a free loopback port.

Used by `rollouts up` when no Redis is configured, and by the tests. The
server is a real redis-server binary (installed by scripts/setup.sh), so the
embedded default behaves exactly like a production Redis.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from redis import Redis
from redis.exceptions import RedisError

from cli.procs import die_with_parent, stop_process

HASH_MAX_LISTPACK_VALUE = 2048


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EmbeddedRedis:
    """A redis-server child process; ``url`` is valid between start() and stop()."""

    def __init__(
        self,
        port: int | None = None,
        data_dir: Path | None = None,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
        password: str | None = None,
        maxmemory: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="rollouts-redis-"))
        self.appendonly = appendonly
        self.extra_args = extra_args or []
        self.password = password
        self.maxmemory = maxmemory  # bytes; None: unbounded (the tests' server)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; run scripts/setup.sh (apt-get install redis-server)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.data_dir / "redis.log"),
            # Bounded, and never evicting: a job record silently dropped would be a lost job. The API
            # refuses new submissions above its high-water mark (api/admission.py) well before this.
            *(["--maxmemory", str(self.maxmemory), "--maxmemory-policy", "noeviction"] if self.maxmemory else []),
            # A job record (about 30 fields, its request a few hundred bytes) stays one compact listpack
            # instead of a hash table with a dict entry per field: about half the memory per record.
            "--hash-max-listpack-value",
            str(HASH_MAX_LISTPACK_VALUE),
            *self.extra_args,
        ]
        if self.password:
            # Through a config file on stdin, not argv: `ps` shows every process's argv.
            args.append("-")
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # A session of its own: a terminal's Ctrl-C goes to the foreground process group, and
            # Redis must outlive the workers that hand their jobs back through it; whoever started
            # it stops it, last.
            start_new_session=True,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 - it only calls prctl
        )
        assert self.process.stdin is not None
        if self.password:
            quoted = self.password.replace("\\", "\\\\").replace('"', '\\"')
            self.process.stdin.write(f'requirepass "{quoted}"\n'.encode())
        self.process.stdin.close()
        deadline = time.monotonic() + timeout
        client = Redis(port=self.port, password=self.password, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    client.ping()
                    return self
                except RedisError as exc:  # not up yet: connection refused, or still loading
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(f"redis-server did not start; see {self.data_dir / 'redis.log'}") from exc
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process:
            stop_process(self.process)
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self) -> None:
        """Stop and start on the same port and data dir (used to test Redis restarts)."""
        own, self._own_dir = self._own_dir, False
        self.stop()
        self._own_dir = own
        self.start()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
