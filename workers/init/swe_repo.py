"""Making a SWE-bench-style instance's repository at its base commit (the instance itself is read
by shared/kinds/swe_instance.py).

The repository comes from `repo_path`, on storage the workers see, else from
the deployment's mirror (`swe_repo_mirror`, one git repository per `repo`):
either a git repository (the tree at `base_commit` is exported) or a directory
of plain files (the tree itself, whose snapshot commit must hash to
`base_commit`). With neither, the Singularity backend copies it out of the
image's /testbed (SWE-bench's images hold it there at base_commit). In
every case the workspace gets a fresh one-commit repository with a fixed
author and date: no history, so no later commit (the fix) to read, and the
same bytes every time, so eval rebuilds exactly what init built.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from shared.kinds.swe_instance import SweInstance, from_image

SNAPSHOT_MESSAGE = "base"
_SNAPSHOT_ENV = {
    "GIT_AUTHOR_NAME": "rollouts",
    "GIT_AUTHOR_EMAIL": "rollouts@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "rollouts",
    "GIT_COMMITTER_EMAIL": "rollouts@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
_SKIP = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache")
IMAGE_REPO_DIR = "/testbed"  # where SWE-bench's images hold the repository
IMAGE_EXPORT_DIR = "/export"  # where the export binds its destination (not over /testbed)


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> bytes:
    """Host git on a repository this process made (never on one an agent touched)."""
    cmd = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.autocrlf=false", "-c", "init.defaultBranch=main"]
    done = subprocess.run(
        [*cmd, *args], cwd=cwd, input=stdin, capture_output=True, env={**os.environ, **_SNAPSHOT_ENV}, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed in {cwd}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def snapshot_commit(tree: Path) -> str:
    """Make `tree` a one-commit repository with fixed author, date and message; returns the hash."""
    git(tree, "init", "-q")
    git(tree, "add", "-A", "--force", ".")
    git(tree, "commit", "-q", "--allow-empty", "-m", SNAPSHOT_MESSAGE)
    return git(tree, "rev-parse", "HEAD").decode().strip()


def export_from_image(instance: SweInstance, dest: Path) -> None:
    """Copy the repository out of the image's /testbed (where SWE-bench's images hold it at base_commit)
    into `dest`, with the image's own tools, its history left behind."""
    import tempfile

    from shared.config import get_settings
    from workers.sandbox import SandboxSpec, create_sandbox
    from workers.sandbox.owner import owned_prefix

    image = instance.image or instance.official_image
    runtime = Path(tempfile.mkdtemp(prefix=owned_prefix("img")))  # swept if this worker dies (owner.py)
    sandbox = create_sandbox(SandboxSpec(image=image, workdir=IMAGE_EXPORT_DIR), dest, runtime, get_settings())
    try:
        copied = sandbox.exec(
            f"cp -a {IMAGE_REPO_DIR}/. {IMAGE_EXPORT_DIR}/ && rm -rf {IMAGE_EXPORT_DIR}/.git", timeout=600
        )
    finally:
        sandbox.stop()
        shutil.rmtree(runtime, ignore_errors=True)
    if not copied.ok:
        why = (copied.stderr or copied.stdout)[-1000:]
        raise RuntimeError(f"{instance.instance_id}: cannot copy {IMAGE_REPO_DIR} out of {image}: {why}")


def materialize(instance: SweInstance, dest: Path) -> str:
    """Write the repository at base_commit into the empty directory `dest`; returns its commit.

    Raises RuntimeError if a plain-file source no longer hashes to base_commit
    (the files were edited after the instance was made).
    """
    if from_image(instance):
        dest.mkdir(parents=True, exist_ok=True)
        export_from_image(instance, dest)
        return snapshot_commit(dest)
    source = instance.source()
    dest.mkdir(parents=True, exist_ok=True)
    if (source / ".git").exists() or ((source / "HEAD").is_file() and (source / "objects").is_dir()):
        archive = git(source, "archive", "--format=tar", instance.base_commit)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
        return snapshot_commit(dest)
    shutil.copytree(source, dest, symlinks=True, ignore=_SKIP, dirs_exist_ok=True)
    commit = snapshot_commit(dest)
    if commit != instance.base_commit:
        raise RuntimeError(
            f"{instance.instance_id}: the files under {source} hash to {commit}, not base_commit "
            f"{instance.base_commit}; rebuild the instance (examples/swe/build.py)"
        )
    return commit


def check_test_patch(instance: SweInstance, repo: Path) -> None:
    """The test patch must apply to the clean base: a broken task fails at init, not as a reward of 0."""
    if instance.test_patch.strip():
        git(repo, "apply", "--check", "--whitespace=nowarn", "-", stdin=instance.test_patch.encode())
