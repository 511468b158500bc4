"""SWE-bench-style instances: reading the dict, and making the repository at its base commit.

Accepted field names are SWE-bench's (also SWE-Gym's), with R2E-Gym's
aliases: `repo_name` for `repo`, `commit_hash` for `base_commit`,
`docker_image`/`image_name` for `image`. FAIL_TO_PASS and PASS_TO_PASS may
be lists or JSON-encoded lists (as SWE-bench stores them). `patch` (the gold
patch) is what validation gives in place of a model's patch.

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
import json
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.tasks.base import TaskValidationError
from workers.init.swe_tests import TestPlan, plan_tests, runner_for

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
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_COMMIT = re.compile(r"^[0-9a-fA-F]{7,40}$")
_SKIP = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache")
_PROJECT_ROOT = Path(__file__).resolve().parents[2]
IMAGE_REPO_DIR = "/testbed"  # where SWE-bench's images hold the repository
IMAGE_EXPORT_DIR = "/export"  # where the export binds its destination (not over /testbed)


@dataclass(frozen=True)
class SweInstance:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    repo_path: str | None
    image: str | None
    version: str | None = None
    test_runner: str | None = None
    gold_patch: str | None = None

    @classmethod
    def from_task(cls, task: dict[str, Any]) -> SweInstance:
        """Read and check an instance dict; raises TaskValidationError naming the field."""

        def text(field: str, *aliases: str, required: bool = True) -> str | None:
            for name in (field, *aliases):
                if task.get(name) is not None:
                    value = task[name]
                    if not isinstance(value, str) or (required and not value.strip()):
                        raise TaskValidationError(f"task.{name}: a non-empty string")
                    return value
            if required:
                raise TaskValidationError(f"task.{field}: required")
            return None

        repo = text("repo", "repo_name") or ""
        if not _REPO.match(repo):
            raise TaskValidationError(f"task.repo: {repo[:100]!r} is not owner/name (letters, digits, '.', '-', '_')")
        base_commit = text("base_commit", "commit_hash") or ""
        if not _COMMIT.match(base_commit):  # it reaches git on the host: a commit id, never an option
            raise TaskValidationError(f"task.base_commit: {base_commit[:100]!r} is not a commit id (7-40 hex digits)")
        fail_to_pass = _test_list(task, "FAIL_TO_PASS")
        if not fail_to_pass:
            raise TaskValidationError("task.FAIL_TO_PASS: at least one test that the fix makes pass")
        return cls(
            instance_id=text("instance_id") or "",
            repo=repo,
            base_commit=base_commit,
            problem_statement=text("problem_statement") or "",
            test_patch=text("test_patch", required=False) or "",
            fail_to_pass=fail_to_pass,
            pass_to_pass=_test_list(task, "PASS_TO_PASS"),
            repo_path=text("repo_path", required=False),
            image=text("image", "docker_image", "image_name", required=False),
            version=str(task["version"]) if isinstance(task.get("version"), (str, int, float)) else None,
            test_runner=text("test_runner", required=False),
            gold_patch=text("patch", required=False),
        )

    def source(self) -> Path:
        """Where the repository is read from (repo_path, else the mirror); raises TaskValidationError if nowhere."""
        if not self.repo_path:
            mirrored = mirror_repository(self.repo)
            if mirrored is None:
                raise TaskValidationError(
                    f"task.repo_path: required: no local copy of {self.repo!r} (give repo_path, or set "
                    f"swe_repo_mirror to a directory holding {self.repo.replace('/', '__')})"
                )
            return mirrored
        path = Path(self.repo_path)
        candidates = [path] if path.is_absolute() else [Path.cwd() / path, _PROJECT_ROOT / path]
        for candidate in candidates:
            if candidate.is_dir():
                return candidate
        raise TaskValidationError(f"task.repo_path: {self.repo_path!r} is not a directory here")

    def test_plan(self) -> TestPlan:
        """The runner and what it runs (workers/init/swe_tests.py); raises TaskValidationError for an id
        the runner could never report."""
        runner = runner_for(self.repo, self.test_runner)
        return plan_tests(self.instance_id, runner, self.test_patch, (*self.fail_to_pass, *self.pass_to_pass))

    @property
    def official_image(self) -> str:
        """SWE-bench's evaluation image of this instance (Docker Hub names cannot hold "__")."""
        return f"docker://swebench/sweb.eval.x86_64.{self.instance_id.lower().replace('__', '_1776_')}:latest"

    @property
    def test_files(self) -> list[str]:
        """Files the test patch touches: restored from the task before tests run."""
        return patch_paths(self.test_patch)


def mirror_repository(repo: str) -> Path | None:
    """`repo` (owner/name) in the configured mirror, as owner__name or owner/name (optionally .git)."""
    from shared.config import get_settings

    mirror = get_settings().swe_repo_mirror
    if mirror is None or not _REPO.match(repo):
        return None
    root = mirror.resolve()
    for name in (repo.replace("/", "__"), repo):
        for candidate in (mirror / name, mirror / f"{name}.git"):
            if candidate.is_dir() and candidate.resolve().is_relative_to(root):
                return candidate
    return None


def _test_list(task: dict[str, Any], field: str) -> tuple[str, ...]:
    value = task.get(field, [])
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            raise TaskValidationError(f"task.{field}: a list of test ids (or its JSON)") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise TaskValidationError(f"task.{field}: a list of test ids")
    return tuple(value)


def patch_paths(patch: str) -> list[str]:
    """Every path a git patch touches (old and new names)."""
    paths: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            parts = line[len("diff --git ") :].split(" b/", 1)
            for part in (parts[0][2:] if parts[0].startswith("a/") else parts[0], parts[-1]):
                if part and part not in paths:
                    paths.append(part)
        elif line.startswith(("+++ b/", "--- a/")):
            part = line[6:]
            if part not in paths:
                paths.append(part)
    return paths


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> bytes:
    """Host git on a repository this process made (never on one an agent touched)."""
    cmd = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.autocrlf=false", "-c", "init.defaultBranch=main"]
    done = subprocess.run([*cmd, *args], cwd=cwd, input=stdin, capture_output=True, env={**os.environ, **_SNAPSHOT_ENV}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed in {cwd}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def snapshot_commit(tree: Path) -> str:
    """Make `tree` a one-commit repository with fixed author, date and message; returns the hash."""
    git(tree, "init", "-q")
    git(tree, "add", "-A", "--force", ".")
    git(tree, "commit", "-q", "--allow-empty", "-m", SNAPSHOT_MESSAGE)
    return git(tree, "rev-parse", "HEAD").decode().strip()


def from_image(instance: SweInstance) -> bool:
    """Whether the repository comes out of the instance's Singularity image (no repo_path, no mirror copy)."""
    from shared.config import get_settings

    return (
        not instance.repo_path
        and get_settings().sandbox_backend == "singularity"
        and mirror_repository(instance.repo) is None
    )


def export_from_image(instance: SweInstance, dest: Path) -> None:
    """Copy the repository out of the image's /testbed (where SWE-bench's images hold it at base_commit)
    into `dest`, with the image's own tools, its history left behind."""
    import tempfile

    from shared.config import get_settings
    from workers.sandbox import SandboxSpec, create_sandbox

    image = instance.image or instance.official_image
    runtime = Path(tempfile.mkdtemp(prefix="ro-img-"))
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
