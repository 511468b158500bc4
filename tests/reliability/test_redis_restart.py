"""Redis restarts mid-run with appendonly yes / appendfsync everysec (the documented production setting).

A clean restart (SIGTERM: Redis flushes the AOF before exiting) loses nothing: the run
completes with every job done once. A crash (SIGKILL) can lose the writes of the last
fsync second; what that means for jobs, and how it is recovered, is in docs/RELIABILITY.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from cli.stack import Stack
from tests.reliability.jobs import scripted_jobs, statuses, submit, wait_all_terminal
from tests.reliability.outage_stack import running_persistent_stack
from tests.support.waiting import client_for, trace, wait_for

JOBS = 60
SLEEP = {"init": 0.1, "rollout": 0.4, "eval": 0.1}


def _aof_settings(stack: Stack) -> tuple[str, str]:
    client = Redis.from_url(stack.redis_url)
    try:
        return client.config_get("appendonly")["appendonly"], client.config_get("appendfsync")["appendfsync"]
    finally:
        client.close()


@pytest.fixture()
def persistent_stack(tmp_path: Path) -> Iterator[Stack]:
    """The Redis fault tests' stack (outage_stack), with 6 rollout slots for this module's 60 short jobs."""
    with running_persistent_stack(tmp_path, {"init": 2, "rollout": 6, "eval": 2}) as stack:
        yield stack


def test_a_clean_redis_restart_mid_run_loses_nothing(persistent_stack: Stack, trace_dir, figure):
    stack = persistent_stack
    assert stack.redis is not None and _aof_settings(stack) == ("yes", "everysec")
    api = client_for(stack)
    ids = submit(api, scripted_jobs(JOBS, trace_dir, SLEEP))
    wait_for(lambda: sum(s == "done" for s in statuses(api, ids).values()) >= 5, what="some jobs done")

    down = time.monotonic()
    stack.redis.restart()
    outage = time.monotonic() - down
    final = wait_all_terminal(api, ids, timeout=180)

    assert len(final) == JOBS, "jobs missing after the restart"
    not_done = {i: api.get(f"/v1/jobs/{i}").json() for i, status in final.items() if status != "done"}
    assert not not_done, f"jobs not done after the restart: {not_done}"
    twice = [i for i in ids if sum(line.startswith("eval end") for line in trace(trace_dir, i)) > 1]
    reruns = sum(
        sum(line.startswith(f"{stage} start") for line in trace(trace_dir, i)) - 1 for i in ids for stage in SLEEP
    )
    assert not twice, f"jobs finished twice: {twice}"
    figure(
        f"{JOBS} jobs, Redis restarted (SIGTERM, AOF everysec) mid-run, {outage:.1f} s down: "
        f"all done, none lost, none twice; stage re-runs {reruns}"
    )


def test_a_redis_crash_mid_run_loses_nothing_acknowledged(persistent_stack: Stack, trace_dir, figure):
    """SIGKILL: Redis had already write()n every acknowledged command to the AOF (the page cache keeps
    it); only a crash of the machine itself can lose the last fsync second."""
    stack = persistent_stack
    assert stack.redis is not None and stack.redis.process is not None
    api = client_for(stack)
    ids = submit(api, scripted_jobs(JOBS, trace_dir, SLEEP))
    wait_for(lambda: sum(s == "done" for s in statuses(api, ids).values()) >= 5, what="some jobs done")

    stack.redis.process.kill()
    stack.redis.process.wait()
    time.sleep(1.0)
    stack.redis.restart()
    final = wait_all_terminal(api, ids, timeout=180)

    assert len(final) == JOBS and all(status == "done" for status in final.values()), final
    twice = [i for i in ids if sum(line.startswith("eval end") for line in trace(trace_dir, i)) > 1]
    assert not twice, f"jobs finished twice: {twice}"
    figure(f"{JOBS} jobs, Redis SIGKILLed mid-run and restarted from its AOF: all done, none lost, none twice")
