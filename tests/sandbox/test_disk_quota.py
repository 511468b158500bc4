"""The sandbox's /tmp is on disk inside its disk quota, and hostile writers are ended by that quota.

Real bubblewrap sandboxes with the real tool server; the writers are `dd`, `yes` and a file-making
loop, into /tmp and into the workspace, through the tool server (rollout) and through exec (init,
eval). Each writer could write far more than the quota; what is checked is that the host keeps only
a bounded amount, that nothing of the sandbox is left writing, and that the failure is
SandboxDiskQuotaExceeded (a failed job, never a reward). No wall-clock figure is asserted.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.config import Settings
from workers.sandbox import SandboxSpec, create_sandbox
from workers.sandbox.quota import DiskQuota, disk_usage
from workers.sandbox.sandbox import SandboxDiskQuotaExceeded
from workers.sandbox.spec import SandboxLimits

from .conftest import pid_namespace_members

MiB = 1024 * 1024
QUOTA = 16 * MiB
# What each writer would leave without the quota: it writes it one MiB (one process) at a time, so
# it is still writing when the quota ends it; the test checks it never got to the end.
UNBOUNDED = 4096 * MiB


def _spec(**limits: int) -> SandboxSpec:
    return SandboxSpec(limits=SandboxLimits(disk_bytes=QUOTA, **limits))


def _pid_ns(box) -> str:
    return box.call("bash", {"command": "readlink /proc/self/ns/pid"}).output.strip()


# --- measuring ---------------------------------------------------------------


def test_usage_counts_allocated_bytes_once_and_follows_no_symlink(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(b"x" * (4 * MiB))
    os.link(tmp_path / "data", tmp_path / "same-data")  # a hard link is the same blocks
    with open(tmp_path / "sparse", "wb") as f:  # a hole allocates nothing
        f.truncate(100 * MiB)
    (tmp_path / "to-root").symlink_to("/usr")
    usage = disk_usage([tmp_path])
    assert 4 * MiB <= usage.bytes < 5 * MiB
    assert usage.files == 4


def test_an_unreadable_directory_cannot_hide_what_it_holds(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "data").write_bytes(b"x" * (2 * MiB))
    hidden.chmod(0)
    try:
        assert disk_usage([tmp_path]).bytes >= 2 * MiB
    finally:
        hidden.chmod(0o700)


def test_quota_reasons_name_the_setting() -> None:
    quota = DiskQuota(max_bytes=10, max_files=2)
    assert quota.exceeded(disk_usage([])) is None
    from workers.sandbox.quota import DiskUsage

    assert "sandbox_disk_bytes" in (quota.exceeded(DiskUsage(bytes=11, files=0)) or "")
    assert "sandbox_disk_files" in (quota.exceeded(DiskUsage(bytes=0, files=3)) or "")


# --- /tmp on disk ------------------------------------------------------------


def test_tmp_is_on_disk_in_the_runtime_dir(sandbox) -> None:
    """/tmp is the runtime dir's scratch directory (counted by the quota), not a tmpfs in RAM."""
    fs = sandbox.call("bash", {"command": "stat -f -c %T /tmp; head -c 3000000 /dev/zero > /tmp/blob"})
    assert not fs.is_error and fs.output.split()[0] != "tmpfs", fs.output
    assert (sandbox.scratch_dir / "blob").stat().st_size == 3_000_000


def test_exec_gets_the_same_disk_backed_tmp(
    require_bwrap, workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> None:
    box = create_sandbox(SandboxSpec(), workspace, short_dir / "rt", sandbox_settings)
    try:
        assert box.exec("echo kept > /tmp/note", timeout=30).ok
        assert (box.scratch_dir / "note").read_text() == "kept\n"
    finally:
        box.stop()
    assert not (short_dir / "rt").exists()


# --- hostile writers -----------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        # many files, each under RLIMIT_FSIZE, into /tmp
        f"for i in $(seq {UNBOUNDED // MiB}); do dd if=/dev/zero of=/tmp/f$i bs=1M count=1 status=none; done",
        # streams into the workspace (RLIMIT_FSIZE is 1 GiB: far above the quota)
        f"for i in $(seq {UNBOUNDED // MiB}); do yes 0123456789abcdef | head -c {MiB} > f$i; done",
    ],
    ids=["dd-into-tmp", "yes-into-workspace"],
)
def test_a_writer_past_the_quota_ends_the_sandbox(
    require_bwrap, workspace: Path, short_dir: Path, sandbox_settings: Settings, command: str
) -> None:
    box = create_sandbox(_spec(), workspace, short_dir / "rt", sandbox_settings)
    box.start()
    try:
        ns = _pid_ns(box)
        with pytest.raises(SandboxDiskQuotaExceeded, match=r"disk quota of 16777216 \(sandbox_disk_bytes\)"):
            box.call("bash", {"command": command}, timeout=30)
        assert pid_namespace_members(ns) == []  # nothing of the sandbox is left writing
        held = disk_usage([workspace, box.runtime_dir]).bytes
        assert held > QUOTA
        last = f"f{UNBOUNDED // MiB}"
        assert not (workspace / last).exists() and not (box.scratch_dir / last).exists()  # the writer was cut short
        assert disk_usage([workspace, box.runtime_dir]).bytes == held  # and nothing grows any more
        with pytest.raises(SandboxDiskQuotaExceeded):  # the sandbox stays ended
            box.call("bash", {"command": "true"})
    finally:
        box.stop()


def test_too_many_files_end_the_sandbox(
    require_bwrap, workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> None:
    """Empty files take no blocks on some filesystems but an inode each: the entry count bounds them."""
    settings = sandbox_settings.model_copy(update={"sandbox_disk_files": 2000})
    box = create_sandbox(_spec(), workspace, short_dir / "rt", settings)
    box.start()
    try:
        with pytest.raises(SandboxDiskQuotaExceeded, match="sandbox_disk_files"):
            box.call(
                "bash", {"command": "mkdir -p many && cd many && for i in $(seq 1000000); do : > f$i; done"}, timeout=30
            )
        assert len(os.listdir(workspace / "many")) < 1_000_000
    finally:
        box.stop()


def test_exec_past_the_quota_raises_instead_of_returning(
    require_bwrap, workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> None:
    """init's setup commands and eval's test runs go through exec: a hostile setup or candidate that
    fills the disk ends that command, and exec raises (the job fails; eval never turns it into a score)."""
    box = create_sandbox(_spec(), workspace, short_dir / "rt", sandbox_settings)
    try:
        with pytest.raises(SandboxDiskQuotaExceeded):
            box.exec(f"for i in $(seq {UNBOUNDED // MiB}); do head -c {MiB} /dev/zero > w$i; done", timeout=60)
        assert disk_usage([workspace]).bytes > QUOTA and not (workspace / f"w{UNBOUNDED // MiB}").exists()
    finally:
        box.stop()


def test_a_workspace_already_over_the_quota_does_not_start(
    require_bwrap, workspace: Path, short_dir: Path, sandbox_settings: Settings
) -> None:
    (workspace / "big").write_bytes(b"x" * (QUOTA + MiB))
    box = create_sandbox(_spec(), workspace, short_dir / "rt", sandbox_settings)
    with pytest.raises(SandboxDiskQuotaExceeded):
        box.start()
    assert not box.running
    with pytest.raises(SandboxDiskQuotaExceeded):
        box.exec("true", timeout=30)
    box.stop()


def test_a_quota_set_by_the_task_is_an_execution_setting() -> None:
    """disk_bytes sits in sandbox.limits, which only an admin (or an operator's profile) may set."""
    assert SandboxLimits(disk_bytes=5).resolved(Settings()).disk_bytes == 5
    assert SandboxLimits().resolved(Settings(sandbox_disk_bytes=7)).disk_bytes == 7
    with pytest.raises(ValueError):
        SandboxLimits(disk_bytes=0)
