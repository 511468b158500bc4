"""Shared fixtures: a real redis-server per test session, flushed for every test; `figure`, a measured line
that pytest prints at the end (never asserted)."""

from __future__ import annotations

import signal
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts or uses a real vLLM server is marked `vllm`, whatever its module says."""
    for item in items:
        if VLLM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.vllm)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The vLLM servers the selected tests use are planned now; the session's start now, in the background."""
    if not session.config.option.collectonly:
        # the tmp_path_factory fixture is not reachable from a hook: its object, as pytest keeps it
        launch_session_servers(session.items, session.config._tmp_path_factory.mktemp("vllm-logs"))


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
    """Report one line of a test's figures (shown in the terminal summary, with or without -s)."""

    def report(line: str) -> None:
        _FIGURES.append(f"{request.node.name}: {line}")
        print(line)

    yield report


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _FIGURES:
        terminalreporter.section("measured figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
