"""What a worker process hands its stages: the slot count it really runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.config import Settings
from workers.runtime import state as worker_state
from workers.runtime.process import WorkerProcess


@pytest.fixture()
def fresh_state() -> Iterator[None]:
    """WorkerProcess builds the process-wide state; keep this test's out of the others'."""
    saved = worker_state._state
    worker_state._state = None
    yield
    if worker_state._state is not None:
        worker_state._state.redis.close()
    worker_state._state = saved


def test_a_concurrency_override_reaches_the_settings_the_stages_get(settings: Settings, fresh_state: None) -> None:
    # The rollout's LLM-call threads are sized from settings.rollout_concurrency: with the
    # default (32) under `--concurrency 100`, 36 of 100 slots waited for a thread on every call.
    configured = settings.rollout_concurrency
    process = WorkerProcess("rollout", settings, concurrency=configured + 68)
    assert process.concurrency == len(process.slots) == configured + 68
    assert worker_state.state().settings.rollout_concurrency == configured + 68
    assert settings.rollout_concurrency == configured, "the caller's settings are left as they were"


def test_the_rollout_warm_up_loads_the_registered_backends_tokenizers(
    settings: Settings, fresh_state: None, tiny_model: Path, tmp_path: Path
) -> None:
    """A rollout worker loads, beside its slots as it starts, the tokenizer of every backend registered then:
    without it, a burst's first 32 jobs each waited ~5 s behind one load (transformers imports torch)."""
    from shared.backend_pool import BackendPool
    from workers.rollout import llm_services

    process = WorkerProcess("rollout", settings, concurrency=1)
    pool = BackendPool(process.state.redis, process.state.store.keys, settings)
    pool.register("http://127.0.0.1:9/v1", "tiny", tokenizer=str(tiny_model))
    pool.register("http://127.0.0.1:10/v1", "elsewhere", tokenizer=str(tmp_path / "not-on-this-node"))
    llm_services._cached_tokenizer.cache_clear()
    process._warm_up()
    assert llm_services._cached_tokenizer.cache_info().currsize == 1  # the missing one is left to its jobs
    llm_services._load_tokenizer(str(tiny_model))
    assert llm_services._cached_tokenizer.cache_info().hits == 1, "a job finds it loaded"


def test_the_warm_up_waits_for_a_backend_and_loads_its_tokenizer_once_one_registers(
    settings: Settings, fresh_state: None, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker usually starts before its backends register (`rollouts up` registers vLLM once it serves): the
    warm-up loads nothing while none is registered (a stack without a backend never pays for transformers'
    import), and the tokenizer of the first one that registers."""
    import threading
    import time

    from shared.backend_pool import BackendPool
    from workers.rollout import llm_services

    monkeypatch.setattr(llm_services, "WARM_UP_POLL_S", 0.05)
    process = WorkerProcess("rollout", settings, concurrency=1)
    llm_services._cached_tokenizer.cache_clear()
    warm_up = threading.Thread(target=process._warm_up, daemon=True)
    warm_up.start()
    time.sleep(0.5)
    assert warm_up.is_alive() and llm_services._cached_tokenizer.cache_info().currsize == 0
    BackendPool(process.state.redis, process.state.store.keys, settings).register(
        "http://127.0.0.1:9/v1", "tiny", tokenizer=str(tiny_model)
    )
    warm_up.join(timeout=120)
    assert not warm_up.is_alive() and llm_services._cached_tokenizer.cache_info().currsize == 1


def test_a_failed_warm_up_leaves_the_worker_running(
    settings: Settings, fresh_state: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from workers.rollout.stage import RolloutStage

    def broken(self: RolloutStage) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(RolloutStage, "warm_up", broken)
    process = WorkerProcess("rollout", settings, concurrency=1)
    process._warm_up()
    assert "warm-up failed" in caplog.text and "no space left on device" in caplog.text


def test_the_warm_up_and_the_first_jobs_load_the_tokenizer_side_by_side(tiny_model: Path) -> None:
    """In a fresh interpreter, the warm-up's import and eight jobs' loads at once all succeed: transformers' lazy
    import is not thread-safe, and a job beside an unlocked warm-up failed with an ImportError (AutoTokenizer)."""
    import subprocess
    import sys

    script = (
        "import threading\n"
        "import time\n"
        "from workers.rollout.llm_services import _load_tokenizer, _tokenizer_class\n"
        "errors = []\n"
        "def job():\n"
        "    try:\n"
        f"        _load_tokenizer({str(tiny_model)!r})\n"
        "    except Exception as exc:\n"
        "        errors.append(repr(exc))\n"
        "warm_up = threading.Thread(target=_tokenizer_class)\n"
        "warm_up.start()\n"
        "time.sleep(0.3)  # the jobs come while the import is under way (an unlocked one failed them here)\n"
        "threads = [threading.Thread(target=job) for _ in range(8)]\n"
        "for thread in threads:\n"
        "    thread.start()\n"
        "for thread in [*threads, warm_up]:\n"
        "    thread.join()\n"
        "print(errors)\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert ran.returncode == 0 and ran.stdout.strip() == "[]", ran.stdout + ran.stderr[-2000:]
