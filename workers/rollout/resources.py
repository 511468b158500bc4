"""Per-process resources of the rollout stage, built once and shared by every slot thread.

The tokenizer (chat templates), the backend pool and the LLM client are all safe to
share across threads; loading them per trajectory would cost seconds and connections.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from shared.backend_pool import BackendPool
from shared.config import Settings
from workers.rollout.llm_client import LLMClient

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


def tokenizer_dir(settings: Settings) -> Path:
    """The agent tokenizer: the setting, else the CPU backend's model (built offline on first use)."""
    if settings.agent_tokenizer is not None:
        return settings.agent_tokenizer
    if settings.cpu_backend_model is not None:
        return settings.cpu_backend_model
    from cpu_backend.bootstrap import tiny_model_dir

    return tiny_model_dir(settings.state_dir, settings.cpu_backend_seed, settings.cpu_backend_max_model_len)


def load_tokenizer(settings: Settings) -> Any:
    return _load_tokenizer(str(tokenizer_dir(settings)))


_tokenizer_lock = threading.Lock()


@lru_cache(maxsize=4)
def _cached_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _load_tokenizer(path: str) -> Any:
    with _tokenizer_lock:  # one load per path, even when many slots start at once
        return _cached_tokenizer(path)
