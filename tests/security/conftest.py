"""In-process API clients over the session's real redis-server, with chosen settings."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from shared.config import Settings


@pytest.fixture()
def make_client(settings: Settings) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**overrides: object) -> TestClient:
        client = TestClient(create_app(settings.model_copy(update=overrides)))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


# Real bubblewrap sandboxes, set up exactly as tests/sandbox does.
from tests.sandbox.conftest import require_bwrap, sandbox, sandbox_settings, short_dir, workspace  # noqa: E402,F401
