"""Fixtures of the weights tests without vLLM: one-tensor checkpoints and backends that fail every update."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.broken_weights_backend import BrokenWeightsBackend


def one_tensor_model(directory: Path, fill: float) -> Path:
    """`directory` holding one safetensors file with one tensor w [2, 2], every value `fill`."""
    import numpy as np
    from safetensors.numpy import save_file

    directory.mkdir()
    save_file({"w": np.full((2, 2), fill, dtype=np.float32)}, str(directory / "model.safetensors"))
    return directory


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    """A readable directory with one safetensors file (no reference to compare shapes with)."""
    return one_tensor_model(tmp_path / "ckpt", 0.0)


@pytest.fixture()
def served_model(tmp_path: Path) -> Path:
    """The directory the double reports as its model's root: what a payload is compared with."""
    return one_tensor_model(tmp_path / "served", 1.0)


@pytest.fixture()
def double_root() -> str:
    """The model root the doubles report in /v1/models: none, unless a test module overrides this."""
    return ""


@pytest.fixture()
def doubles(double_root: str) -> Iterator[Callable[..., BrokenWeightsBackend]]:
    """Start BrokenWeightsBackend doubles of the model "tiny" on demand; all are stopped after the test."""
    started: list[BrokenWeightsBackend] = []

    def start(**kwargs: object) -> BrokenWeightsBackend:
        double = BrokenWeightsBackend("tiny", root=double_root, **kwargs).start()  # type: ignore[arg-type]
        started.append(double)
        return double

    yield start
    for double in started:
        double.stop()
