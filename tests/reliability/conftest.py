"""Fault-injection runs on a real stack. Each test reports a figure (the `figure` fixture, tests/conftest.py).

Figures are reported, never asserted: only correctness is (nothing lost, nothing twice).
"""

from __future__ import annotations

# Shared fixtures, here rather than imported by each test module (where a fixture's parameter
# would shadow its import): a module's own fixture of the same name still wins.
from tests.agent.conftest import model_dir, tokenizer  # noqa: F401
from tests.pipeline.conftest import make_stack, trace_dir  # noqa: F401
from tests.reliability.backend_fixtures import api, healthy  # noqa: F401
from tests.reliability.outage_stack import persistent_stack  # noqa: F401
