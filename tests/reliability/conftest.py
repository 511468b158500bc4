"""Fault-injection runs on a real stack. Each test reports a figure (the `figure` fixture, tests/conftest.py).

Figures are reported, never asserted: only correctness is (nothing lost, nothing twice).
"""

from __future__ import annotations

from tests.pipeline.conftest import make_stack, trace_dir  # noqa: F401
