"""singularity/service.def copies every package the project installs, and the client distribution the
project depends on (apptainer is not on this machine, so the image itself is not built here; see
docs/OPERATIONS.md)."""

from __future__ import annotations

import re

import tomllib

from tests.slurm.conftest import REPO


def _section(text: str, name: str) -> list[str]:
    match = re.search(rf"^%{name}\n(.*?)(?=^%|\Z)", text, re.S | re.M)
    assert match, f"no %{name} section"
    return [line.split() for line in match.group(1).splitlines() if line.strip() and not line.strip().startswith("#")]


def test_service_definition_copies_every_installed_package():
    text = (REPO / "singularity" / "service.def").read_text()
    copied = {source for source, _dest in _section(text, "files")}
    assert all((REPO / source).exists() for source in copied), copied
    includes = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in includes}
    assert packages | {"pyproject.toml", "client"} == copied


def test_service_definition_installs_and_tests_the_cli():
    text = (REPO / "singularity" / "service.def").read_text()
    post = " ".join(" ".join(line) for line in _section(text, "post"))
    assert "pip install --no-cache-dir -q /opt/rollouts/src/client /opt/rollouts/src" in post
    assert ["/opt/rollouts/venv/bin/rollouts", "--help", ">/dev/null"] in _section(text, "test")
