"""Shared fixtures: a real redis-server per test session, flushed for every test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from shared.config import Settings
from shared.embedded_redis import EmbeddedRedis


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
