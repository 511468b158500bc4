"""What a worker process hands its stages: the slot count it really runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.config import Settings
from workers.runtime import state as worker_state
from workers.runtime.process import WorkerProcess


@pytest.fixture()
def fresh_state() -> Iterator[None]:
    """WorkerProcess builds the process-wide state; keep this test's out of the others'."""
    saved = worker_state._state
    worker_state._state = None
    yield
    if worker_state._state is not None:
        worker_state._state.redis.close()
    worker_state._state = saved


def test_a_concurrency_override_reaches_the_settings_the_stages_get(settings: Settings, fresh_state: None) -> None:
    # The rollout's LLM-call threads are sized from settings.rollout_concurrency: with the
    # default (32) under `--concurrency 100`, 36 of 100 slots waited for a thread on every call.
    configured = settings.rollout_concurrency
    process = WorkerProcess("rollout", settings, concurrency=configured + 68)
    assert process.concurrency == len(process.slots) == configured + 68
    assert worker_state.state().settings.rollout_concurrency == configured + 68
    assert settings.rollout_concurrency == configured, "the caller's settings are left as they were"
