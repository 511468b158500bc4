"""vLLM servers for the benchmarks: those named by `--backend-url`, or the tiny model's, started here.

A benchmark run on its own starts its servers (the CPU build on the tiny model, float32, as
`rollouts up` starts it) and stops them at its end; given `--backend-url URL` (repeatable) it uses
servers that already run instead, as the test suite's smoke tests do with the session's server
(tests/bench/). A given server must serve the tiny model as `tiny`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cli.embedded_redis import free_port
from cli.tiny_model import tiny_model_dir
from cli.vllm_server import VLLMServer
from shared.config import Settings

SERVED_NAME = "tiny"


def tiny_model() -> Path:
    """The tiny model in the per-user cache the tests use: built once, and vLLM's compile cache (keyed by
    the model's path) stays warm across runs, so a server starts in ~25 s instead of ~80 s."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollouts" / "test-models"
    return tiny_model_dir(cache, seed=0, max_model_len=4096)


def add_backend_option(parser: argparse.ArgumentParser, what: str = "") -> None:
    """`--backend-url URL`, repeatable; `what` adds to its help what the benchmark does to the servers."""
    parser.add_argument(
        "--backend-url",
        action="append",
        default=[],
        metavar="URL",
        help=f"a vLLM server that already runs, serving the tiny model as {SERVED_NAME!r} (repeat for more); "
        f"default: start them here{what}",
    )


def start_backends(n: int, work: Path, bind_cores: bool = False) -> list[VLLMServer]:
    """n servers on the tiny model, ready. With `bind_cores`, each is bound to a core of its own where there
    are enough: vLLM's CPU build spins its OpenMP threads after a step, so servers sharing cores slow each
    other down by hundreds of ms a call whenever calls alternate between them (measured here: 36 ms a turn
    on one server, 530 ms when consecutive turns alternate between two servers on the same 2 cores)."""
    model = tiny_model()
    cores = os.cpu_count() or 1
    servers = []
    try:
        for i in range(n):
            server = VLLMServer.from_settings(
                Settings(),
                model,
                free_port(),
                served_name=SERVED_NAME,
                log_path=work / f"vllm-{i}.log",
                args=["--dtype", "float32", "--max-model-len", "4096"],
            )
            if bind_cores and n <= cores:
                server.env["VLLM_CPU_OMP_THREADS_BIND"] = str(i)
            servers.append(server.start())
        for server in servers:
            server.wait_until_ready(900, _say)
    except BaseException:
        stop(servers)
        raise
    return servers


def stop(servers: list[VLLMServer]) -> None:
    for server in servers:
        server.stop()


@contextmanager
def vllm_urls(given: list[str], n: int, work: Path, bind_cores: bool = False) -> Iterator[list[str]]:
    """The URLs of `given` servers as they are, else of n servers started here and stopped on exit."""
    if given:
        yield [url.rstrip("/") for url in given]
        return
    servers = start_backends(n, work, bind_cores)
    try:
        yield [server.url for server in servers]
    finally:
        stop(servers)


def _say(message: str) -> None:
    print(message, flush=True)
