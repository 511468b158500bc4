"""Singularity/Apptainer backend for HPC: rootless, contained, no network, .sif images.

Each sandbox process is an ``apptainer exec`` of the job's image with:
``--contain`` (empty /tmp, minimal /dev, no host paths), ``--workdir`` (that /tmp
and /var/tmp on disk in the runtime dir, inside the disk quota, not in memory), ``--no-home``,
``--cleanenv`` (the host environment stays out; ``--env-file`` sets ours),
``--writable-tmpfs`` (the image's filesystem is writable, in memory, for this
process only: state that must survive lives in the workspace), ``--pid`` and
``--ipc`` (own namespaces, so killing the container's init ends every process
in it), ``--net --network none`` unless the task asks for network, and exactly
two binds: the workspace at the spec's ``workdir`` (default ``sandbox_workdir``) and the runtime dir (socket).
The tool server must be installed in the image (singularity/sandbox.def).
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from shared.config import Settings
from workers.sandbox.images import ImageCache
from workers.sandbox.sandbox import Sandbox, SandboxError
from workers.sandbox.spec import SandboxSpec

# Where singularity/sandbox.def installs the project and its tool server.
TOOLSERVER_PYTHON = "/opt/rollouts/venv/bin/python"


def apptainer_command(
    executable: str,
    image: Path,
    argv: list[str],
    *,
    workspace: Path,
    workdir: str,
    runtime_dir: Path,
    env_file: Path,
    network: bool,
    scratch_dir: Path,
) -> list[str]:
    """The ``apptainer exec`` argv for ``argv`` (pure: tested against the documented flags)."""
    cmd = [executable, "exec", "--contain", "--workdir", str(scratch_dir)]
    cmd += ["--no-home", "--cleanenv", "--writable-tmpfs"]
    cmd += ["--pid", "--ipc", "--no-privs"]
    if not network:
        cmd += ["--net", "--network", "none"]
    cmd += ["--bind", f"{workspace}:{workdir}:rw", "--bind", f"{runtime_dir}:{runtime_dir}:rw"]
    cmd += ["--pwd", workdir, "--env-file", str(env_file)]
    cmd += [str(image), *argv]
    return cmd


class SingularitySandbox(Sandbox):
    backend = "singularity"
    toolserver_python = TOOLSERVER_PYTHON

    def __init__(self, spec: SandboxSpec, workspace: Path, runtime_dir: Path, settings: Settings) -> None:
        super().__init__(spec, workspace, runtime_dir, settings)
        source = spec.image or settings.sandbox_default_image
        if not source:
            raise SandboxError("the singularity backend needs an image (task sandbox.image or sandbox_default_image)")
        self.source = source
        self.images = ImageCache(settings.image_cache)
        self._image: Path | None = None

    @property
    def poolable(self) -> str | None:
        # The pool's hand-off (a bind mount follows its directory) and reset were run with bubblewrap only;
        # no Apptainer was installed to try them (docs/SANDBOX.md, Sandbox pool and lifetimes).
        return "pooling Apptainer sandboxes was never tried (no Apptainer here)"

    @property
    def workdir(self) -> str:
        return self.spec.workdir or self.settings.sandbox_workdir

    @property
    def executable(self) -> str:
        return self.settings.singularity_executable

    def _acquire(self) -> None:
        if shutil.which(self.executable) is None:
            raise SandboxError(f"{self.executable} is not installed on this node")
        if self._image is None:
            try:
                self._image = self.images.resolve(self.source)
            except Exception as exc:  # any fetch failure is the same failure to start
                raise SandboxError(f"cannot get image {self.source}: {exc}") from exc

    def _env_file(self, env: dict[str, str]) -> Path:
        path = self.runtime_dir / f"env-{abs(hash(tuple(sorted(env.items()))))}"
        path.write_text("".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items()))
        return path

    def wrap(self, argv: list[str], env: dict[str, str]) -> list[str]:
        image = self._image if self._image is not None else Path(self.source)
        return apptainer_command(
            self.executable,
            image,
            argv,
            workspace=self.workspace,
            workdir=self.workdir,
            runtime_dir=self.runtime_dir,
            env_file=self._env_file(env),
            network=self.spec.network,
            scratch_dir=self.scratch_dir,
        )
