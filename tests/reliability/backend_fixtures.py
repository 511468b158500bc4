"""Fixtures of the LLM-backend fault tests: a pool emptied around each test, and a healthy scripted backend.

Imported by tests/reliability/conftest.py; each module that uses them has its own `stack`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from tests.reliability.agent_stack import call, deregister_all
from tests.support.scripted_llm import ScriptedLLM
from tests.support.waiting import client_for

# What every scripted backend of these tests answers: a bash call, then the finish.
SCRIPTS = {
    "two-turns": [call("bash", command="echo turn one"), "Done. " + call("finish", answer="ok")],
    "after": [call("finish", answer="ok")],
}


@pytest.fixture()
def api(stack: Stack) -> Iterator[httpx.Client]:
    """The module's stack with no backend registered, before and after the test."""
    client = client_for(stack)
    deregister_all(client)
    yield client
    deregister_all(client)


@pytest.fixture()
def healthy(tokenizer: Any) -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM(tokenizer, scripts=dict(SCRIPTS)).start()
    yield llm
    llm.stop()
