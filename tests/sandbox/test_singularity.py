"""The Singularity backend as far as it goes without Apptainer on this machine.

Apptainer is not packaged for Debian 12 nor on PyPI, so these tests check the
exact command lines against Apptainer's documented ``exec`` flags, the image
cache's fetch-once behaviour, and the clear failure when the binary is absent.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from shared.config import Settings
from tests.support.waiting import wait_for
from workers.sandbox import SandboxError, SandboxSpec, create_sandbox
from workers.sandbox.images import ImageCache
from workers.sandbox.pool import SandboxPool
from workers.sandbox.pool_sizing import Demand
from workers.sandbox.profile import SandboxProfile
from workers.sandbox.singularity import TOOLSERVER_PYTHON, SingularitySandbox, apptainer_command


def _settings(tmp_path: Path, **extra: object) -> Settings:
    return Settings(state_dir=tmp_path / "state", sandbox_backend="singularity", **extra)


def test_command_is_rootless_contained_and_offline(tmp_path: Path) -> None:
    cmd = apptainer_command(
        "apptainer",
        Path("/images/base.sif"),
        ["bash", "-c", "echo hi"],
        workspace=Path("/shared/ws/job1"),
        workdir="/workspace",
        runtime_dir=Path("/tmp/rt/job1"),
        env_file=Path("/tmp/rt/job1/env"),
        network=False,
        scratch_dir=Path("/tmp/rt/job1/tmp"),
    )
    assert cmd[:2] == ["apptainer", "exec"]
    options = cmd[2 : cmd.index("/images/base.sif")]
    for flag in ("--contain", "--no-home", "--cleanenv", "--writable-tmpfs", "--pid", "--ipc", "--no-privs"):
        assert flag in options
    assert options[options.index("--net") + 1 : options.index("--net") + 3] == ["--network", "none"]
    binds = [options[i + 1] for i, opt in enumerate(options) if opt == "--bind"]
    assert binds == ["/shared/ws/job1:/workspace:rw", "/tmp/rt/job1:/tmp/rt/job1:rw"]
    assert options[options.index("--pwd") + 1] == "/workspace"
    # /tmp and /var/tmp on disk in the runtime dir (inside the disk quota), not Apptainer's in-memory session dir
    assert options[options.index("--workdir") + 1] == "/tmp/rt/job1/tmp"
    assert options[options.index("--env-file") + 1] == "/tmp/rt/job1/env"
    assert "--fakeroot" not in options and "--writable" not in options
    assert cmd[cmd.index("/images/base.sif") + 1 :] == ["bash", "-c", "echo hi"]


def test_network_flag_lifts_only_the_network(tmp_path: Path) -> None:
    cmd = apptainer_command(
        "singularity",
        Path("i.sif"),
        ["true"],
        workspace=Path("/w"),
        workdir="/workspace",
        runtime_dir=Path("/r"),
        env_file=Path("/r/env"),
        network=True,
        scratch_dir=Path("/r/tmp"),
    )
    assert "--net" not in cmd and "--network" not in cmd and "--contain" in cmd


def test_sandbox_wraps_the_tool_server_and_writes_the_env_file(tmp_path: Path, short_dir: Path) -> None:
    (tmp_path / "ws").mkdir()
    image = tmp_path / "base.sif"
    image.write_bytes(b"SIF")
    spec = SandboxSpec(image=str(image), env={"A": "x y", "B": "1,2"})
    box = create_sandbox(spec, tmp_path / "ws", short_dir / "rt", _settings(tmp_path))
    assert isinstance(box, SingularitySandbox)
    box.runtime_dir.mkdir()
    cmd = box.wrap(box.toolserver_argv(), box.base_env())
    tail = cmd[cmd.index(str(image)) + 1 :]
    assert tail[:3] == [TOOLSERVER_PYTHON, "-m", "workers.toolserver"]
    assert tail[tail.index("--workspace") + 1] == "/workspace"
    assert cmd[cmd.index("--workdir") + 1] == str(box.scratch_dir) == str(box.runtime_dir / "tmp")
    env_text = Path(cmd[cmd.index("--env-file") + 1]).read_text()
    assert "A='x y'\n" in env_text and "B=1,2\n" in env_text and "HOME=/tmp\n" in env_text


@pytest.mark.skipif(shutil.which("apptainer") is not None, reason="Apptainer is installed here")
def test_missing_apptainer_is_a_clear_start_error(tmp_path: Path, short_dir: Path) -> None:
    (tmp_path / "ws").mkdir()
    image = tmp_path / "base.sif"
    image.write_bytes(b"SIF")
    box = create_sandbox(SandboxSpec(image=str(image)), tmp_path / "ws", short_dir / "rt", _settings(tmp_path))
    with pytest.raises(SandboxError, match="not installed"):
        box.start()
    assert not (short_dir / "rt").exists()


def test_no_image_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="needs an image"):
        create_sandbox(SandboxSpec(), tmp_path, tmp_path / "rt", _settings(tmp_path))


def test_images_are_fetched_once_even_concurrently(tmp_path: Path) -> None:
    calls: list[str] = []

    def fetch(source: str, destination: Path) -> None:
        calls.append(source)
        time.sleep(0.2)  # long enough for the other threads to queue on the lock
        destination.write_bytes(b"SIF:" + source.encode())

    cache = ImageCache(tmp_path / "images", fetch=fetch)
    results: list[Path] = []
    uri = "docker://python:3.11-slim"
    threads = [threading.Thread(target=lambda: results.append(cache.resolve(uri))) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["docker://python:3.11-slim"]
    assert len(set(results)) == 1 and results[0].read_bytes() == b"SIF:docker://python:3.11-slim"
    assert cache.resolve("docker://python:3.11-slim") == results[0] and len(calls) == 1
    assert sorted(p.suffix for p in (tmp_path / "images").iterdir()) == [".lock", ".sif"]


def test_failed_fetch_leaves_no_partial_image(tmp_path: Path) -> None:
    def fetch(source: str, destination: Path) -> None:
        destination.write_bytes(b"half")
        raise RuntimeError("registry unreachable")

    cache = ImageCache(tmp_path / "images", fetch=fetch)
    with pytest.raises(RuntimeError):
        cache.resolve("oras://ghcr.io/x/y:1")
    assert not list((tmp_path / "images").glob("*.sif")) and not list((tmp_path / "images").glob(".*partial"))


def test_definition_files_are_keyed_by_content(tmp_path: Path) -> None:
    recipe = tmp_path / "a.def"
    recipe.write_text("Bootstrap: docker\nFrom: debian:12\n")
    cache = ImageCache(tmp_path / "images", fetch=lambda source, dest: dest.write_bytes(b"SIF"))
    first = cache.resolve(str(recipe))
    recipe.write_text("Bootstrap: docker\nFrom: debian:13\n")
    assert cache.resolve(str(recipe)) != first
    with pytest.raises(ValueError):
        cache.resolve("ubuntu")


def test_the_pool_does_not_take_apptainer_sandboxes_it_never_ran(tmp_path: Path, short_dir: Path) -> None:
    """Never tried with a real Apptainer: the pool starts none ahead, and jobs start their own as before."""
    settings = Settings(
        state_dir=tmp_path, sandbox_backend="singularity", sandbox_default_image="/x.sif", sandbox_pool_interval_s=0.05
    )
    box = create_sandbox(SandboxSpec(), tmp_path / "ws", short_dir / "rt", settings)
    assert box.poolable and "never tried" in box.poolable
    pool = SandboxPool(settings, lambda: Demand(free_slots=1, queue_depth=1))
    try:
        assert pool.take(SandboxProfile.of(SandboxSpec(), settings, python=True)) is None
        wait_for(lambda: pool.unpoolable, what="the pool to find it cannot pool here")
        assert pool.ready_count() == 0 and pool.stats.started == 0
    finally:
        pool.close()
