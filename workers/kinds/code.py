"""The `code` kind's stages (its spec: shared/kinds/code.py): the agent writes a solution file; hidden
tests judge it in a fresh sandbox, one sandbox per test (workers/eval/code_tests.py).
"""

from __future__ import annotations

import ast
import math
from typing import Any

from shared.kinds.code import CodeSpec
from shared.kinds.code_tests import parse_tests
from shared.kinds.formats import code_fields
from shared.tasks.context import StageContext
from workers.eval.code_tests import run_isolated, summary
from workers.eval.fresh_sandbox import fresh_sandbox, sandbox_python
from workers.kinds.agentic import AgentTask
from workers.sandbox.spec import SandboxLimits, SandboxSpec
from workers.sandbox.workspace import place_files, read_agent_file

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
MAX_SOLUTION_BYTES = 1024 * 1024

SYSTEM_PROMPT = (
    "You are a programming agent working in a sandbox with bash, a Python interpreter and file tools. "
    "Write your solution to the file `{entry}` in the workspace (the create tool writes a whole file). "
    "Test it yourself; hidden tests will be run against `{entry}` after you finish. "
    "Call finish when the file holds your final solution."
)


class CodeKind(CodeSpec, AgentTask):
    # --- the agent's side ---------------------------------------------------
    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        task = code_fields(task)
        entry = task.get("entry_file", "solution.py")
        system = task.get("system_prompt") or SYSTEM_PROMPT.format(entry=entry)
        return [{"role": "system", "content": system}, {"role": "user", "content": task["prompt"]}]

    def init_files(self, task: dict[str, Any]) -> dict[str, str]:
        """The init state: extra files, and the starter code at the entry file."""
        task = code_fields(task)
        files = dict(task.get("files") or {})
        if "starter_code" in task:
            files[task.get("entry_file", "solution.py")] = task["starter_code"]
        return files

    def prepare_workspace(self, ctx: StageContext) -> dict[str, Any]:
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        files = self.init_files(ctx.task)
        place_files(ctx.workspace, files)
        return {"files": sorted(files)}

    def collect(self, ctx: StageContext, sandbox: Any) -> dict[str, Any]:
        """The solution file as the agent left it (only this file is judged)."""
        entry = ctx.task.get("entry_file", "solution.py")
        try:
            return {"solution": read_agent_file(ctx.workspace, entry, MAX_SOLUTION_BYTES)}
        except ValueError as exc:
            return {"solution": None, "solution_error": str(exc)}

    # --- judging ------------------------------------------------------------
    def eval_spec(self, task: dict[str, Any]) -> SandboxSpec:
        timeout = float(task.get("timeout_s", DEFAULT_TIMEOUT_S))
        limits = SandboxLimits(
            memory_bytes=int(task.get("memory_mb", DEFAULT_MEMORY_MB)) * 1024 * 1024,
            cpu_seconds=math.ceil(timeout) + 1,
        )
        return SandboxSpec(limits=limits)

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        task = code_fields(ctx.task)
        extra = (ctx.outputs.get("rollout") or {}).get("extra") or {}
        solution = extra.get("solution")
        tests = parse_tests(task)
        scoring = task.get("scoring", "fraction")
        if not isinstance(solution, str):
            reason = extra.get("solution_error") or f"the agent left no {task.get('entry_file', 'solution.py')}"
            return {
                "reward": 0.0,
                "passed": 0,
                "total": len(tests.cases),
                "scoring": scoring,
                "error": reason,
                "reason": f"no solution to test: {reason}",
            }
        entry = task.get("entry_file", "solution.py")
        solution = with_setup(task, solution)
        python = sandbox_python(ctx.settings, task)
        timeout = float(task.get("timeout_s", DEFAULT_TIMEOUT_S))
        spec = self.eval_spec(task)

        def open_box(populate: Any) -> Any:  # one fresh sandbox and workspace per test
            return fresh_sandbox(spec, ctx.settings, python, ctx.check, lambda: ctx.remaining, populate)

        results = run_isolated(open_box, tests, self.init_files(task), entry, solution, python, timeout)
        scored = summary(results, scoring)
        failed = [f"{r['name']}: {r['status']}" for r in results if not r["passed"]]
        scored["reason"] = f"{scored['passed']}/{scored['total']} tests passed ({scoring} scoring)" + (
            f"; not passed: {', '.join(failed[:5])}" if failed else ""
        )
        return scored


def with_setup(task: dict[str, Any], solution: str) -> str:
    """The solution as judged: the task's `setup_code` (MBPP's test_setup_code) first, in the solution's own
    module, as MBPP's harness runs setup, code and tests as one program; the solution still runs in a
    process of its own (workers/eval/split_harness.py)."""
    setup = task.get("setup_code")
    if not isinstance(setup, str) or not setup.strip():
        return solution
    lines = solution.splitlines(keepends=True)
    head = _future_imports_end(solution)  # `from __future__` must stay first
    return "".join(lines[:head]) + f"{setup.rstrip()}\n\n" + "".join(lines[head:])


def _future_imports_end(solution: str) -> int:
    """How many lines the solution's docstring and `from __future__` imports take (0 if none, or unparsable)."""
    try:
        body = ast.parse(solution).body
    except SyntaxError:
        return 0
    end = 0
    for index, node in enumerate(body):
        docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            end = node.end_lineno or end
        elif not docstring:
            break
    return end
