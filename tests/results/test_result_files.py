"""The results store on its own: round trips, atomic writes, every way a write or a read can fail, retention."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from shared.codec import pack
from shared.errors import ResultsUnavailable, StoredResultCorrupt, StoredResultGone
from shared.results import ResultStore

TRAJECTORY = {"token_ids": list(range(8000)), "logprobs": [-0.5] * 8000, "mask": [1] * 8000}


@pytest.fixture()
def store(tmp_path: Path) -> ResultStore:
    root = tmp_path / "results"
    root.mkdir()
    return ResultStore(root)


def test_a_result_comes_back_exactly_and_compressed(store: ResultStore) -> None:
    ref, size = store.put("job1", "rollout", TRAJECTORY)
    assert store.get("job1", "rollout", ref) == TRAJECTORY
    path = store.path("job1", "rollout", ref)
    assert path == store.root / ref / "job1.rollout.msgpack.zst"
    assert size == path.stat().st_size
    assert size < len(pack(TRAJECTORY)) / 2, "not compressed"
    assert [p.name for p in path.parent.iterdir()] == ["job1.rollout.msgpack.zst"], "temp file left"


def test_a_missing_root_is_not_recreated_and_the_write_names_it(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "mounted-share")
    with pytest.raises(ResultsUnavailable, match="mounted-share does not exist"):
        store.put("job1", "rollout", TRAJECTORY)
    assert not store.root.exists()
    assert not store.health().healthy and "does not exist" in store.health().reason


def test_a_full_disk_fails_the_write_says_so_and_leaves_no_temp_file(
    store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ResultsUnavailable, match="the results store is full") as raised:
        store.put("job1", "rollout", TRAJECTORY)
    assert "job1.rollout" in str(raised.value)
    assert not [p for p in store.root.rglob("*") if p.is_file()], "a partial file was left behind"


def test_an_unwritable_root_fails_the_write_and_the_health_check(
    store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", refused)
    with pytest.raises(ResultsUnavailable, match="Permission denied"):
        store.put("job1", "rollout", TRAJECTORY)
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root ignores modes; ask as a user would
    assert store.health().reason.endswith("is not writable")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any mode")
def test_a_read_only_root_is_unhealthy_and_refuses_writes(store: ResultStore) -> None:
    store.root.chmod(0o500)
    try:
        assert not store.health().healthy
        with pytest.raises(ResultsUnavailable):
            store.put("job1", "rollout", TRAJECTORY)
    finally:
        store.root.chmod(0o700)


def test_too_little_free_space_is_unhealthy(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, min_free_bytes=2**62)
    assert not store.health().healthy
    assert "bytes free" in store.health().reason


def test_a_deleted_file_is_gone_and_named(store: ResultStore) -> None:
    ref, _ = store.put("job1", "rollout", TRAJECTORY)
    store.path("job1", "rollout", ref).unlink()
    with pytest.raises(StoredResultGone) as raised:
        store.get("job1", "rollout", ref)
    assert raised.value.job_id == "job1" and raised.value.path == str(store.path("job1", "rollout", ref))


@pytest.mark.parametrize("damage", [b"", b"not zstd at all", "truncated"])
def test_a_corrupt_file_is_named(store: ResultStore, damage: bytes | str) -> None:
    ref, _ = store.put("job1", "rollout", TRAJECTORY)
    path = store.path("job1", "rollout", ref)
    path.write_bytes(path.read_bytes()[:20] if damage == "truncated" else damage)  # type: ignore[arg-type]
    with pytest.raises(StoredResultCorrupt, match=f"job job1: stored result {path} is corrupt"):
        store.get("job1", "rollout", ref)


def test_a_damaged_reference_is_named_and_never_leaves_the_root(store: ResultStore) -> None:
    with pytest.raises(StoredResultCorrupt, match="not a results bucket"):
        store.get("job1", "rollout", "../../etc")


def test_the_sweep_removes_expired_buckets_only_and_reports_them(store: ResultStore) -> None:
    now = time.time()
    old_ref, old_size = store.put("old", "rollout", TRAJECTORY, now=now - 3 * 3600)
    older_ref, older_size = store.put("older", "eval", {"reward": 1.0}, now=now - 5 * 3600)
    new_ref, _ = store.put("new", "rollout", TRAJECTORY, now=now)
    (store.root / "not-a-bucket").mkdir()

    report = store.sweep(max_age_s=2 * 3600, now=now)

    assert report.files == 2 and report.bytes == old_size + older_size
    assert sorted(report.buckets) == sorted({old_ref, older_ref})
    assert store.get("new", "rollout", new_ref) == TRAJECTORY
    assert (store.root / "not-a-bucket").is_dir(), "the sweep removed something that is not its own"
    assert store.sweep(max_age_s=2 * 3600, now=now).files == 0
