"""Shared fixtures: a real redis-server per test session, flushed for every test; `figure`, a measured line
that pytest prints at the end (never asserted).

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadscope`, scheduled by `work_unit`): each
test module is run whole by one worker, so a module-scoped stack or server starts once and sees its tests in order;
the directories in RUN_TOGETHER are one unit each. Each worker is a pytest session of its own, with its own
redis-server and vLLM servers.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from cli.embedded_redis import EmbeddedRedis
from shared.config import Settings
from tests.support.vllm_server import (  # noqa: F401 - fixtures
    launch_due_servers,
    launch_session_servers,
    long_context_vllm_server,
    start_vllm_servers,
    stop_session_servers,
    tiny_model,
    vllm_server,
    weights_vllm_server,
)

# Run as a foreground terminal would: a suite launched in the background by a non-interactive
# shell inherits SIGINT ignored, and every child it starts would too (`rollouts up` could not
# be stopped with Ctrl-C). Children inherit only an *ignored* disposition, so this resets them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


VLLM_FIXTURES = {"vllm_server", "start_vllm_servers", "long_context_vllm_server", "weights_vllm_server"}
# tests/weights: its modules share `weights_vllm_server` (one start instead of one per worker); tests/slurm: its
# modules each start a Slurm cluster and a stack, which two at once would only slow down.
RUN_TOGETHER = ("tests/weights/", "tests/slurm/")


def work_unit(nodeid: str) -> str:
    """What one xdist worker runs whole: the test's module, or its directory when that is in RUN_TOGETHER."""
    module = nodeid.split("::", 1)[0]
    return next((directory for directory in RUN_TOGETHER if module.startswith(directory)), module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadscope` by work_unit: a module's tests (and its module-scoped stack) stay on one worker."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts or uses a real vLLM server is marked `vllm`, whatever its module says."""
    for item in items:
        if VLLM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.vllm)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The vLLM servers the selected tests use are planned now; the session's start now, in the background."""
    if not session.config.option.collectonly:
        # the tmp_path_factory fixture is not reachable from a hook: its object, as pytest keeps it
        launch_session_servers(
            session.items,
            session.config._tmp_path_factory.mktemp("vllm-logs"),
            ahead=not os.environ.get("PYTEST_XDIST_WORKER"),
        )


def pytest_runtest_protocol(item: pytest.Item) -> None:
    """The other servers start in the background a few modules before the first test that uses them."""
    launch_due_servers(item)


def pytest_sessionfinish(session: pytest.Session) -> None:
    stop_session_servers()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.stop()


@pytest.fixture()
def redis_url(redis_server: EmbeddedRedis) -> str:
    client = Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture()
def redis(redis_url: str) -> Iterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture()
def settings(redis_url: str, tmp_path: Path) -> Settings:
    return Settings(redis_url=redis_url, state_dir=tmp_path / "state")


@pytest.fixture()
def short_dir() -> Iterator[Path]:
    """A short base path for what holds a Unix socket (a sandbox's runtime dir): sun_path is 108 bytes, and
    pytest's tmp_path is long, longer still under an xdist worker (`.../popen-gw0/<test name>0`)."""
    path = Path(tempfile.mkdtemp(prefix="sbx-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def make_client(settings: Settings) -> Iterator[Callable[..., TestClient]]:
    """In-process API clients over the session's redis-server, each with its own setting overrides."""
    clients: list[TestClient] = []

    def make(**overrides: object) -> TestClient:
        client = TestClient(create_app(settings.model_copy(update=overrides)))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


_FIGURES: list[str] = []


@pytest.fixture()
def figure(request: pytest.FixtureRequest) -> Iterator[Callable[[str], None]]:
    """Report one line of a test's figures (shown in the terminal summary, with or without -s, and from
    xdist's workers: the line travels in the test's report)."""

    def report(line: str) -> None:
        request.node.user_properties.append(("figure", line))
        print(line)

    yield report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        name = report.nodeid.split("::")[-1]
        _FIGURES.extend(f"{name}: {value}" for key, value in report.user_properties if key == "figure")


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _FIGURES:
        terminalreporter.section("measured figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
