"""The API process loads no worker code: after start-up and a job of every built-in kind, submitted,
run to its reward and read back, its `sys.modules` holds no `workers.*` module. Each kind's spec
(shared/kinds/) is all the API needs; the stage code (workers/kinds/) is the workers' alone.
import-linter holds the same wall for imports written in the code (tests/test_layers.py); this
holds it for what is imported by name at run time (the registry, ROLLOUTS_TASK_MODULES)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shared.kinds
from cli.stack import Stack
from rollouts_client import RolloutClient
from shared.config import Settings
from tests.support.published_rows import GSM8K, MBPP
from tests.support.swe_repos import pytest_row
from tests.support.waiting import wait_for
from workers.sandbox.local import bwrap_usable


class ApiModuleListStack(Stack):
    """The stack, its API started through tests/support/api_module_list.py (the same command plus an exit hook)."""

    def start_api(self):  # type: ignore[no-untyped-def]
        argv = [sys.executable, "-m", "tests.support.api_module_list", "api", "--port", str(self.api_port)]
        self.api = self._spawn("api", argv)
        return self.api


@pytest.fixture()
def stack(tmp_path: Path) -> Iterator[tuple[Stack, Path, dict]]:
    usable, reason = bwrap_usable()
    if not usable:
        pytest.skip(f"bubblewrap cannot run here: {reason}")
    swe_row = pytest_row(tmp_path / "mirror" / "acme__pyfix")
    module_list = tmp_path / "api-modules.txt"
    service = ApiModuleListStack(
        Settings(redis_url=None, state_dir=tmp_path / "state"),
        api_port=0,
        concurrency={"init": 1, "rollout": 2, "eval": 2},
        log_dir=tmp_path / "logs",
        extra_env={"ROLLOUTS_SWE_REPO_MIRROR": str(tmp_path / "mirror"), "ROLLOUTS_TEST_MODULE_LIST": str(module_list)},
    )
    try:
        service.start()
        service.wait_for_workers()
        yield service, module_list, swe_row
    finally:
        service.stop(timeout=10)


def test_the_api_process_loads_no_worker_module_after_a_job_of_every_builtin_kind(stack) -> None:
    service, module_list, swe_row = stack
    reference = {"given": {"reference": True}}
    jobs = [
        {"task": {"kind": "demo", "text": "stressed"}},
        {"task": {"kind": "math", "format": "gsm8k", **GSM8K}, **reference},
        {"task": {"kind": "stem", "question": "What is 6 times 7?", "answer": "42"}, **reference},
        {"task": {"kind": "code", "format": "mbpp", **MBPP}, **reference},
        {"task": {"kind": "swe", "format": "swebench", **swe_row}, **reference},
    ]
    assert sorted(job["task"]["kind"] for job in jobs) == sorted(shared.kinds.__all__)  # every built-in kind
    with RolloutClient(service.api_url, timeout=30) as client:
        ids = client.submit_jobs(jobs)
        done = client.wait_jobs(ids, timeout=600)
    assert [(job.status, job.reward) for job in done] == [("done", 1.0)] * len(jobs), [job.error for job in done]

    service.stop(timeout=10)  # the API writes its module list as it exits
    wait_for(module_list.exists, timeout=30, what="the API's module list")
    loaded = module_list.read_text().split()
    assert "api.app" in loaded and "shared.kinds.swe" in loaded  # the list is the API's, its specs loaded
    assert [name for name in loaded if name == "workers" or name.startswith("workers.")] == []
