"""Fault-injection runs on a real stack. Each test reports a figure; pytest prints them all at the end.

Figures are reported, never asserted: only correctness is (nothing lost, nothing twice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.pipeline.conftest import make_stack, trace_dir  # noqa: F401

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
        terminalreporter.section("reliability figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
