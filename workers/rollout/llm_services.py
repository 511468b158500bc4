"""Per-process resources of the rollout stage, built once and shared by every slot thread.

The tokenizers (one per served model), the backend pool and the LLM client are all safe to
share across threads; loading them per trajectory would cost seconds and connections.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from shared.backend_pool import BackendPool, Pin
from shared.errors import RolloutsError
from workers.rollout.llm_client import LLMClient

log = logging.getLogger("rollouts.rollout")
WARM_UP_POLL_S = 2.0  # how often the warm-up looks for a registered backend
_lock = threading.Lock()
_llm: LLMServices | None = None


@dataclass(frozen=True)
class LLMServices:
    pool: BackendPool
    client: LLMClient


def llm_services() -> LLMServices:
    """The worker process's pool and client (from its Redis connection and settings)."""
    global _llm
    with _lock:
        if _llm is None:
            from workers.runtime.state import state

            st = state()
            _llm = LLMServices(BackendPool(st.redis, st.store.keys, st.settings), LLMClient.from_settings(st.settings))
        return _llm


class TokenizerUnavailable(RolloutsError, RuntimeError):
    """The backend's model has no tokenizer this worker can read: an infrastructure error, never a reward."""


def load_tokenizer(pin: Pin) -> Any:
    """The tokenizer (and chat template) of the model the pinned backend serves; never another model's.

    Backends register the directory of their model's tokenizer (vLLM's `/v1/models` reports
    the served model's local path as `root`); the workers must see the same path (a shared
    filesystem on a cluster).
    """
    if not pin.tokenizer:
        raise TokenizerUnavailable(
            f"backend {pin.backend_id} serves model {pin.model!r} but registered no tokenizer directory; "
            "register it with `rollouts register --tokenizer DIR` (a local Hugging Face model or tokenizer dir)"
        )
    path = Path(pin.tokenizer)
    if not (path / "tokenizer_config.json").exists() and not (path / "tokenizer.json").exists():
        raise TokenizerUnavailable(
            f"model {pin.model!r} (backend {pin.backend_id}): no tokenizer at {path} on this worker's node; "
            "the directory must be readable here (shared storage) or registered with --tokenizer"
        )
    return _load_tokenizer(str(path))


_tokenizer_lock = threading.RLock()


def _tokenizer_class() -> Any:
    """transformers' AutoTokenizer, imported under the one lock: its lazy import is not thread-safe (a job's
    import beside the warm-up's found AutoTokenizer missing from the half-imported module)."""
    with _tokenizer_lock:
        from transformers import AutoTokenizer

        return AutoTokenizer


@lru_cache(maxsize=8)
def _cached_tokenizer(path: str) -> Any:
    return _tokenizer_class().from_pretrained(path, local_files_only=True)


def _load_tokenizer(path: str) -> Any:
    with _tokenizer_lock:  # one load per path, even when many slots start at once
        return _cached_tokenizer(path)


def warm_tokenizers() -> None:
    """The rollout stage's warm-up: once a backend with a tokenizer this node can read is registered (a worker
    usually starts first: `rollouts up` registers its vLLM once it serves), import the tokenizer code and load
    each such backend's tokenizer. A worker that never sees one never imports it (the suite's many stacks
    without a backend), and one whose first job came first has nothing left to do. A tokenizer that does not
    load here is left to the job that pins its backend, which reports what is wrong (load_tokenizer)."""
    while not (paths := _readable_tokenizers()):
        if _cached_tokenizer.cache_info().currsize:
            return
        time.sleep(WARM_UP_POLL_S)
    _tokenizer_class()  # the bulk of a first load: transformers imports torch
    for path in paths:
        try:
            _load_tokenizer(str(path))
        except Exception as exc:  # noqa: BLE001 - the job that pins this backend gets the error
            log.warning("warm-up: the tokenizer at %s did not load: %s", path, exc)


def _readable_tokenizers() -> list[Path]:
    """The tokenizer directories of the registered backends that this node can read (none while Redis is away)."""
    try:
        backends = llm_services().pool.backends()
    except RedisError:
        return []
    paths = {Path(b.tokenizer) for b in backends if b.tokenizer}
    return sorted(p for p in paths if (p / "tokenizer_config.json").exists() or (p / "tokenizer.json").exists())
