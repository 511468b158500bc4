"""A fresh, throwaway sandbox for judging: never the agent's live workspace.

Evaluators build the state to judge (a fresh copy of the init state plus the
agent's solution or diff) in a new node-local directory and run everything
the agent wrote inside a new sandbox over it, with the task's limits. Before
anything is judged, a probe command must succeed: a sandbox that cannot run
at all raises SandboxError (the job fails as an infrastructure error) instead
of turning into a row of failed tests and a silent reward of 0.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from shared.config import Settings
from workers.sandbox import ExecResult, Sandbox, SandboxError, SandboxSpec, create_sandbox
from workers.sandbox.owner import owned_prefix

PROBE_TIMEOUT_S = 60.0
# pytest loads every plugin installed beside it (entry points). This service's environment carries its own
# (its test suite's, FastAPI's anyio): no part of the repository under test, and ~3 s of CPU per pytest start
# on 2 cores against 0.2 s without. An image's or a task's own interpreter keeps its environment's plugins.
SERVICE_PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def sandbox_python(settings: Settings, task: dict | None = None) -> str:
    """The interpreter tests run with inside a sandbox.

    The local backend binds this service's Python environment read-only into
    the sandbox, so its interpreter (with pytest) is there; an image
    (Singularity) brings its own ``python3``. A task may name its own.
    """
    if task and isinstance(task.get("python"), str):
        return task["python"]
    return sys.executable if settings.sandbox_backend == "local" else "python3"


def pytest_env(python: str) -> dict[str, str]:
    """The environment a pytest run with `python` gets: none of this service's own plugins when `python` is
    this service's interpreter (SERVICE_PYTEST_ENV), nothing otherwise."""
    return dict(SERVICE_PYTEST_ENV) if python == sys.executable else {}


@dataclass
class EvalBox:
    """A fresh sandbox and its directories: `workspace` (its /workspace) and `runtime` (host-only paths
    the evaluator writes patches to and reads reports from; bound into the sandbox at the same path)."""

    sandbox: Sandbox
    workspace: Path
    runtime: Path
    check: Callable[[], None]
    remaining: Callable[[], float]

    def run(
        self, command: str | list[str], timeout: float, output_cap: int | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        """Run one command, bounded by `timeout` and by what is left of the stage.

        Raises (through `check`) once the stage is out of time, so an eval that
        overran its stage ends as timed out, not as a failed test.
        """
        self.check()
        budget = max(0.1, min(timeout, self.remaining()))
        result = self.sandbox.exec(command, timeout=budget, env=env, output_cap=output_cap)
        self.check()
        return result


@contextmanager
def fresh_sandbox(
    spec: SandboxSpec,
    settings: Settings,
    python: str,
    check: Callable[[], None],
    remaining: Callable[[], float],
    populate: Callable[[Path], None],
    needs: tuple[str, ...] = (),
) -> Iterator[EvalBox]:
    """A new directory filled by `populate(workspace)`, a sandbox over it, probed; removed afterwards.

    The probe also imports `needs` (e.g. pytest): a missing test runner is the deployment's fault.
    """
    base = Path(tempfile.mkdtemp(prefix=owned_prefix("ev")))  # swept if this worker dies (owner.py)
    workspace, runtime = base / "ws", base / "rt"
    workspace.mkdir()
    runtime.mkdir(mode=0o700)
    sandbox: Sandbox | None = None
    try:
        populate(workspace)
        sandbox = create_sandbox(spec, workspace, runtime, settings)
        box = EvalBox(sandbox, workspace, runtime, check, remaining)
        imports = "".join(f"import {module}; " for module in needs)
        probe = box.run([python, "-c", f"{imports}print('ready')"], PROBE_TIMEOUT_S)
        if not probe.ok or probe.stdout.strip() != "ready":
            wanted = f" with {', '.join(needs)}" if needs else ""
            raise SandboxError(
                f"eval sandbox cannot run {python}{wanted}: exit {probe.exit_code}, timed out {probe.timed_out}: "
                f"{(probe.stderr or probe.stdout)[-1000:]}"
            )
        yield box
    finally:
        if sandbox is not None:
            sandbox.stop()
        shutil.rmtree(base, ignore_errors=True)
