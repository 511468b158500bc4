"""The Redis client a worker process shares among its threads must hold one connection per slot and more."""

from __future__ import annotations

import threading

from shared.config import Settings
from shared.redis_conn import connect


def test_one_client_serves_more_blocked_threads_than_redis_py_s_default_pool(redis_url: str) -> None:
    # 150 threads blocked at once, as 100 rq slots waiting for jobs plus LLM-call threads are:
    # redis-py 8's default pool (100 connections) raised MaxConnectionsError here.
    client = connect(Settings(redis_url=redis_url))
    errors: list[BaseException] = []
    barrier = threading.Barrier(150)

    def wait_for_a_job() -> None:
        try:
            barrier.wait(timeout=30)
            client.blpop(["test:empty-queue"], timeout=1)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=wait_for_a_job) for _ in range(150)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    client.close()
    assert not errors, errors[:3]
