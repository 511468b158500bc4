"""Fixtures of the security tests: real sandboxes as tests/sandbox sets them up (API clients: tests/conftest.py)."""

from __future__ import annotations

from tests.pipeline.conftest import make_stack, trace_dir  # noqa: F401 - a stack and its trace

# Real bubblewrap sandboxes, set up exactly as tests/sandbox does.
from tests.sandbox.conftest import (  # noqa: F401
    net_sandbox,
    require_bwrap,
    require_slirp,
    sandbox,
    sandbox_settings,
    workspace,
)
