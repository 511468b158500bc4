"""`rollouts weights update|show` against a real `rollouts api`, with a backend test double that fails updates."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli.test_cli_failures import one_line, rollouts
from tests.support.broken_weights_backend import BrokenWeightsBackend
from tests.support.live_api import running_api


@pytest.fixture()
def api_with_broken_backend(tmp_path: Path) -> Iterator[str]:
    double = BrokenWeightsBackend("tiny").start()
    try:
        with running_api(tmp_path) as url:
            assert httpx.post(f"{url}/v1/backends", json={"url": double.url, "model": "tiny"}).status_code == 201
            yield url
    finally:
        double.stop()


def test_update_reports_each_backend_and_exits_1_when_one_failed(api_with_broken_backend: str, tmp_path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(checkpoint / "model.safetensors"))
    url = api_with_broken_backend
    result = rollouts("weights", "update", "tiny", "--version", "v1", "--path", str(checkpoint), "--url", url)
    assert result.returncode == 1, result.stderr
    assert "failed" in result.stdout and "removed from the pool" in result.stdout and "pause" in result.stdout
    shown = rollouts("weights", "show", "tiny", "--url", url)
    assert shown.returncode == 0 and "never updated" in shown.stdout


def test_a_missing_checkpoint_is_one_line_naming_the_field_and_exit_5(api_with_broken_backend: str) -> None:
    result = rollouts(
        "weights", "update", "tiny", "--version", "v1", "--path", "/no/such/ckpt", "--url", api_with_broken_backend
    )
    assert result.returncode == 5
    assert "body.path" in one_line(result)


def test_upload_sends_the_file_and_reports_each_backend(api_with_broken_backend: str, tmp_path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    file = tmp_path / "model.safetensors"
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(file))
    url = api_with_broken_backend
    result = rollouts("weights", "update", "tiny", "--version", "v1", "--upload", str(file), "--url", url)
    assert result.returncode == 1, result.stderr  # it reached the backend, whose pause step failed
    assert "failed" in result.stdout and "removed from the pool" in result.stdout and "pause" in result.stdout
    (tmp_path / "junk").write_bytes(b"not safetensors")
    refused = rollouts("weights", "update", "tiny", "--version", "v1", "--upload", str(tmp_path / "junk"), "--url", url)
    assert refused.returncode == 5 and "body" in one_line(refused)


def test_exactly_one_of_path_and_upload(api_with_broken_backend: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    both = rollouts(
        "weights",
        "update",
        "tiny",
        "--version",
        "v1",
        "--path",
        "/x",
        "--upload",
        str(tmp_path / "f"),
        "--url",
        api_with_broken_backend,
    )
    neither = rollouts("weights", "update", "tiny", "--version", "v1", "--url", api_with_broken_backend)
    assert both.returncode == neither.returncode == 2 and "exactly one" in both.stderr + neither.stderr
