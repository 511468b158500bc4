"""The `swe` kind's stages (its spec: shared/kinds/swe.py): fix a repository so its failing tests pass,
judged like SWE-bench.

init makes the repository at base_commit in the workspace; the agent edits it
with bash and the file tools; `collect` takes the agent's diff against a fresh
copy of the base (computed by git outside the agent's tree, so its .git,
hooks and config are never used); eval applies that diff to another fresh copy
in a fresh sandbox, restores the tests from the task and runs FAIL_TO_PASS and
PASS_TO_PASS with the repository's own runner (workers/eval/swe_resolve.py).
`image` is for the Singularity backend (default: SWE-bench's published image of
the instance, whose environment expects the repository at /testbed, so the
workspace is bound there and its `testbed` conda Python runs the tests); the
local backend ignores it.
"""

from __future__ import annotations

import base64
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from shared.config import Settings
from shared.kinds.swe import SweSpec
from shared.kinds.swe_instance import SweInstance
from shared.tasks.context import StageContext
from workers.eval.fresh_sandbox import fresh_sandbox, sandbox_python
from workers.eval.swe_resolve import resolve
from workers.init.swe_repo import check_test_patch, materialize
from workers.kinds.agentic import AgentTask, agent_env
from workers.sandbox.spec import SandboxLimits, SandboxSpec
from workers.sandbox.workspace import WorkspaceError, workspace_diff

DEFAULT_TEST_TIMEOUT_S = 300.0
DEFAULT_MEMORY_MB = 4096
SWEBENCH_WORKDIR = "/testbed"
SWEBENCH_ENV_BIN = "/opt/miniconda3/envs/testbed/bin"
MAX_DIFF_BYTES = 2 * 1024 * 1024
_CACHE_CLEANUP = "find . -name __pycache__ -type d -prune -exec rm -rf {} + ; rm -rf .pytest_cache; true"

SYSTEM_PROMPT = (
    "You are a software engineer. The repository is checked out in your working directory "
    "(a git repository). Fix the issue the user describes by editing the source code with the "
    "bash and file tools; run the tests with {test_command} to check your work. Do not edit "
    "the tests: they are restored before your change is judged. Call finish when you are done."
)
# How the agent is told to run the tests, per runner (shared/kinds/swe_tests.py).
TEST_HINTS = {
    "pytest": "`python -m pytest`",
    "django": "`python tests/runtests.py --verbosity 2 <test labels, e.g. module.Class>`",
    "sympy": "`python bin/test <test files>`",
}


class SweKind(SweSpec, AgentTask):
    # --- the agent's side ---------------------------------------------------
    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        instance = SweInstance.from_task(task)
        system = task.get("system_prompt") or SYSTEM_PROMPT.format(test_command=TEST_HINTS[instance.test_plan().runner])
        user = f"Repository: {instance.repo}\n\n<issue>\n{instance.problem_statement.strip()}\n</issue>"
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def sandbox_spec(self, task: dict[str, Any], settings: Settings) -> SandboxSpec:
        image, workdir, env = image_setup(SweInstance.from_task(task), settings)
        return SandboxSpec(image=image, workdir=workdir, env={**agent_env(settings), **env})

    def prepare_workspace(self, ctx: StageContext) -> dict[str, Any]:
        instance = SweInstance.from_task(ctx.task)
        if ctx.workspace.exists():  # a re-run of init after a crash: start from nothing
            shutil.rmtree(ctx.workspace)
        commit = materialize(instance, ctx.workspace)
        check_test_patch(instance, ctx.workspace)
        return {"commit": commit, "instance_id": instance.instance_id}

    def collect(self, ctx: StageContext, sandbox: Any) -> dict[str, Any]:
        """The agent's changes as a binary git diff against a fresh copy of the base."""
        if sandbox is not None and not getattr(sandbox, "opened", True):
            return {"diff": ""}  # no tool opened the on-demand sandbox: the workspace is the base init made
        if sandbox is not None:
            sandbox.exec(_CACHE_CLEANUP, timeout=60)  # test caches are not part of the fix
        instance = SweInstance.from_task(ctx.task)
        with tempfile.TemporaryDirectory(prefix="ro-base-") as tmp:
            base = Path(tmp) / "base"
            materialize(instance, base)
            oversized = changed_bytes_at_least(base, ctx.workspace, MAX_DIFF_BYTES)
            if oversized is not None:
                return {"diff": None, "diff_error": oversized}
            try:
                diff = workspace_diff(base, ctx.workspace)
            except WorkspaceError as exc:
                return {"diff": None, "diff_error": str(exc)}
        if len(diff) > MAX_DIFF_BYTES:
            return {"diff": None, "diff_error": f"the diff is {len(diff)} bytes, over {MAX_DIFF_BYTES}"}
        try:
            return {"diff": diff.decode("utf-8")}
        except UnicodeDecodeError:  # a text file in another encoding: keep the exact bytes
            return {"diff": None, "diff_b64": base64.b64encode(diff).decode("ascii")}

    # --- judging ------------------------------------------------------------
    def eval_spec(self, task: dict[str, Any], settings: Settings) -> SandboxSpec:
        memory = int(task.get("memory_mb", DEFAULT_MEMORY_MB)) * 1024 * 1024
        image, workdir, env = image_setup(SweInstance.from_task(task), settings)
        return SandboxSpec(image=image, workdir=workdir, env=env, limits=SandboxLimits(memory_bytes=memory))

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        instance = SweInstance.from_task(ctx.task)
        extra = (ctx.outputs.get("rollout") or {}).get("extra") or {}
        diff: str | bytes | None = extra.get("diff")
        if not isinstance(diff, str) and isinstance(extra.get("diff_b64"), str):
            diff = base64.b64decode(extra["diff_b64"])
        if not isinstance(diff, (str, bytes)):
            error = extra.get("diff_error") or "the rollout produced no diff"
            return {
                "reward": 0.0,
                "instance_id": instance.instance_id,
                "resolved": False,
                "error": error,
                "reason": error,
            }
        if not diff.strip():  # as SWE-bench's harness: an empty patch is unresolved, its tests are not run
            return {
                "reward": 0.0,
                "instance_id": instance.instance_id,
                "resolved": False,
                "empty_patch": True,
                "reason": "not resolved: the agent changed nothing (an empty diff); the tests were not run",
            }
        python = sandbox_python(ctx.settings, ctx.task)
        if ctx.settings.sandbox_backend == "singularity" and not instance.image and "python" not in ctx.task:
            python = f"{SWEBENCH_ENV_BIN}/python"  # SWE-bench's image: its testbed environment
        timeout = float(ctx.task.get("test_timeout_s", DEFAULT_TEST_TIMEOUT_S))
        needs = ("pytest",) if instance.test_plan().runner == "pytest" else ()
        with fresh_sandbox(
            self.eval_spec(ctx.task, ctx.settings),
            ctx.settings,
            python,
            ctx.check,
            lambda: ctx.remaining,
            lambda ws: materialize(instance, ws),
            needs=needs,
        ) as box:
            return resolve(box, instance, diff, python, timeout)


def image_setup(instance: SweInstance, settings: Settings) -> tuple[str | None, str | None, dict[str, str]]:
    """(image, workdir, env) of the instance's sandboxes. With Singularity: the row's image, else SWE-bench's
    published one; the workspace at /testbed (where those images' environments expect the repository) and
    the testbed environment first on PATH. The local backend uses none of these."""
    if settings.sandbox_backend != "singularity":
        return instance.image, None, {}
    path = f"{SWEBENCH_ENV_BIN}:/opt/miniconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return instance.image or instance.official_image, SWEBENCH_WORKDIR, {"PATH": path}


def changed_bytes_at_least(base: Path, workspace: Path, limit: int) -> str | None:
    """Why the diff of `workspace` against `base` must be over `limit` bytes, or None.

    Counts a lower bound of the diff's size from file sizes alone (new files whole, changed
    files by how much they grew or shrank), so a huge file the agent wrote is refused before
    git reads it into memory, and no diff that would fit is refused.
    """
    total = 0
    for directory, dirs, files in os.walk(workspace):
        if Path(directory) == workspace and ".git" in dirs:
            dirs.remove(".git")
        for name in files:
            path = Path(directory) / name
            try:
                info = path.lstat()
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            try:
                old = (base / path.relative_to(workspace)).lstat()
                before = old.st_size if stat.S_ISREG(old.st_mode) else 0
            except OSError:
                before = 0
            total += abs(info.st_size - before)
            if total > limit:
                return f"the changes add or remove over {limit} bytes (the diff would be larger than {limit})"
    return None
