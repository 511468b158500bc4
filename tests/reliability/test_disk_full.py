"""A real full disk (ENOSPC) under the jobs' workspaces, with a real stack, bubblewrap sandboxes and tool server.

A size-capped tmpfs (8 MiB) is mounted over `<state_dir>/workspaces` only: the embedded Redis
keeps its AOF and RDB in the state dir, and a full Redis disk is a different fault. The agent fills
it from inside its sandbox. Needs root (to mount); skipped otherwise. The mount is always undone.

Where a full disk lands decides the outcome:

- *the agent's own writes* (bash, python) fail with ENOSPC: error observations naming "No space left
  on device", the job goes on and is scored. The agent ran into its own quota, as with EFBIG
  (test_sandbox_faults), and it can free the space itself.
- *a write by the system* on that filesystem (another job's init, a kind that writes in its
  workspace after the agent) fails with OSError: that job is `failed`, the error names the disk.
  It is not the policy's doing (or not only), so no reward.
- the terminal state removes the job's workspace, which frees the space; the same worker
  processes run the next job to `done`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from tests.reliability.agent_stack import (
    assert_worker_serves_next_job,
    call,
    observations,
    scripted_agent_stack,
    submit,
)
from tests.support.small_disk import small_tmpfs
from tests.support.waiting import TERMINAL, client_for, job, wait_for, wait_status

DISK_BYTES = 8 * 1024 * 1024
ENOSPC = "No space left on device"
# Far above the disk, so ENOSPC comes before EFBIG.
ENV = {"ROLLOUTS_SANDBOX_FILE_SIZE_BYTES": str(256 * 1024 * 1024)}
FILL = call("bash", command="dd if=/dev/zero of=big bs=1M count=64")
FINISH = "Done. " + call("finish", answer="ok")
SCRIPTS = {
    "after": [FINISH],
    "fill-then-free": [
        FILL,
        call("python", code="open('big2.bin', 'wb').write(b'0' * 4_000_000)"),
        call("bash", command="echo still here > out.txt"),
        # Hold the disk full until the test has seen a neighbour's init fail (it creates `go`:
        # an empty file needs no blocks on tmpfs).
        call("bash", command="for i in $(seq 1200); do [ -e go ] && break; sleep 0.1; done; ls go", timeout=150),
        call("bash", command="rm -f big big2.bin && echo still here > out.txt && cat out.txt"),
        FINISH,
    ],
    "fill-and-finish": [FILL, FINISH],
}


@pytest.fixture(scope="module")
def disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(base dir for the stack, the workspaces dir with an 8 MiB tmpfs over it); unmounted at the end."""
    base = tmp_path_factory.mktemp("disk-full")
    with small_tmpfs(base / "state" / "workspaces", DISK_BYTES) as workspaces:
        yield base, workspaces


@pytest.fixture(scope="module")
def stack(disk: tuple[Path, Path], model_dir: Path, tokenizer: Any) -> Iterator[Stack]:
    base, workspaces = disk
    with scripted_agent_stack(base, model_dir, ENV, SCRIPTS, tokenizer) as started:
        assert started.settings.workspaces == workspaces
        # Only the workspaces are on the small disk, not Redis's files in the state dir.
        assert os.stat(workspaces).st_dev != os.stat(started.settings.state_dir).st_dev
        yield started


@pytest.fixture()
def api(stack: Stack) -> httpx.Client:
    return client_for(stack)


def used(workspaces: Path) -> int:
    fs = os.statvfs(workspaces)
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


def full(workspaces: Path) -> bool:
    return os.statvfs(workspaces).f_bavail == 0


def assert_names_the_disk(message: str, workspaces: Path) -> None:
    """ENOSPC, and which filesystem: the flush's OSError has no file name, the runner adds the free space."""
    assert ENOSPC in message and f"workspaces {workspaces}: 0 of {DISK_BYTES} bytes free" in message, message


def wait_removed(workspaces: Path, job_id: str) -> None:
    """The worker removes a job's workspace just after it records the terminal status."""
    wait_for(lambda: not (workspaces / job_id).exists(), timeout=10, what=f"job {job_id}'s workspace to go")


def worker_pids(stack: Stack) -> dict[str, list[int]]:
    for stage, processes in stack.workers.items():
        assert all(p.poll() is None for p in processes), f"a {stage} worker died"
    return {stage: [p.pid for p in processes] for stage, processes in stack.workers.items()}


def test_the_agent_fills_the_disk_an_error_observation_and_a_neighbour_fails(
    stack: Stack, api: httpx.Client, figure
) -> None:
    """The agent's dd and python writes fill the workspaces' disk: error observations naming ENOSPC
    (its own action against its own quota, like EFBIG), and the job goes on. While the disk is full,
    another job's init cannot write its workspace: that job is `failed` with an OSError naming the
    disk (not the second job's doing: dropped or resubmitted, not scored), at once, not hung. Then
    the agent frees the space and its job ends `done` with its reward; its workspace is removed, so
    the disk is empty again, and the same workers run the next job."""
    workspaces = stack.settings.workspaces
    wait_for(lambda: used(workspaces) == 0, timeout=10, what="an empty disk")
    pids = worker_pids(stack)
    job_id = submit(api, "fill-then-free", kind="agent-tools")
    wait_for(lambda: full(workspaces), timeout=90, what="the agent to fill the disk")
    filled = time.monotonic()

    neighbour = submit(api, "after", kind="agent-echo", input="x" * 10_000)  # init must write a page
    record = wait_status(api, neighbour, timeout=30)
    neighbour_failed = time.monotonic() - filled
    assert record["status"] == "failed", record
    error = record["error"]
    assert error["stage"] == "init" and error["type"] == "OSError", error
    assert_names_the_disk(error["message"], workspaces)
    wait_removed(workspaces, neighbour)

    (workspaces / job_id / "go").touch()
    record = wait_status(api, job_id, timeout=90)
    ended = time.monotonic() - filled
    assert record["status"] == "done", record.get("error")
    trajectory = record["result"]["trajectory"]
    dd, kernel, echo, _, freed = observations(trajectory)[:5]
    assert dd["exit_code"] != 0 and ENOSPC in dd["output"], dd
    assert kernel["is_error"] and ENOSPC in kernel["output"], kernel
    assert echo["exit_code"] != 0 and ENOSPC in echo["output"], echo
    assert freed["exit_code"] == 0 and freed["output"].strip() == "still here", freed
    assert trajectory["extra"] == {"out": "still here"} and record["result"]["reward"] == 1.0
    wait_removed(workspaces, job_id)
    assert used(workspaces) == 0

    assert worker_pids(stack) == pids
    assert_worker_serves_next_job(stack, api, pids["rollout"][0])
    figure(
        f"agent filled the {DISK_BYTES >> 20} MiB workspace disk: ENOSPC observations (dd, python, echo); "
        f"a neighbour's init failed {neighbour_failed:.1f} s after the fill (OSError, '{ENOSPC}'); "
        f"the agent freed it, job done {ended:.1f} s after the fill; disk empty, same workers"
    )


def test_a_write_after_the_agent_on_a_full_disk_fails_the_job(stack: Stack, api: httpx.Client, figure) -> None:
    """The agent fills the disk and finishes without freeing it. The rollout still ends (its
    trajectory goes to Redis, not to this disk), but the kind's eval writes in the workspace and gets
    ENOSPC: the job is `failed` in eval with an error naming the disk, never hung or lost, and the
    eval worker lives on. Failing (no reward) is right because the write that broke is the system's,
    not an action the agent saw. The failed job's workspace is removed, so the space comes back
    without anyone's help, and the same workers run the next job."""
    workspaces = stack.settings.workspaces
    wait_for(lambda: used(workspaces) == 0, timeout=10, what="an empty disk")
    pids = worker_pids(stack)
    job_id = submit(api, "fill-and-finish", kind="agent-notes")
    # The job may end right after the fill; then the figure counts from when the test saw it end.
    wait_for(
        lambda: full(workspaces) or job(api, job_id)["status"] in TERMINAL,
        timeout=90,
        what="the agent to fill the disk",
    )
    filled = time.monotonic()
    record = wait_status(api, job_id, timeout=90)
    ended = time.monotonic() - filled
    assert record["status"] == "failed", record
    error = record["error"]
    assert error["stage"] == "eval" and error["type"] == "OSError", error
    assert_names_the_disk(error["message"], workspaces)
    wait_removed(workspaces, job_id)
    assert used(workspaces) == 0, "the disk is freed"

    assert worker_pids(stack) == pids
    assert_worker_serves_next_job(stack, api, pids["rollout"][0])
    figure(
        f"agent left the disk full, the kind's eval write failed: job failed (eval, {error['type']}, "
        f"'{ENOSPC}') {ended:.1f} s after the fill; disk freed, same workers run the next job"
    )


def test_the_disk_full_note_names_the_filesystems(tmp_path: Path) -> None:
    """The stage runner's note on ENOSPC and EDQUOT (what the runs above read), and nothing for other errors."""
    from workers.runtime.stage_runner import _disk_full_note

    note = _disk_full_note(OSError(28, ENOSPC), tmp_path)
    assert note.startswith(f" (workspaces {tmp_path}: ") and "node-local temp" in note and "bytes free" in note
    assert _disk_full_note(OSError(122, "Disk quota exceeded"), tmp_path).startswith(" (workspaces")
    assert _disk_full_note(OSError(13, "Permission denied"), tmp_path) == ""
    assert _disk_full_note(ValueError("no"), tmp_path) == ""
    assert _disk_full_note(OSError(28, ENOSPC), tmp_path / "gone").startswith(" (node-local temp")
