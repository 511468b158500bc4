"""The Redis clients: a worker process's holds one connection per slot and more; the API's stays fail-fast."""

from __future__ import annotations

import socket
import threading

from redis import Redis
from rq.worker import SimpleWorker

from shared.config import Settings
from shared.jobs.queues import stage_queue, stage_workers
from shared.redis_conn import connect, connect_for_requests


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


def test_reading_worker_status_leaves_the_api_client_s_fail_fast_timeout_alone(redis_url: str) -> None:
    # rq's Worker raises its client's socket timeout to its dequeue wait (415 s by default) for every
    # later connection: on the API's client, a request would wait minutes on a frozen Redis.
    api_client = connect_for_requests(Settings(redis_url=redis_url))
    slot_client = Redis.from_url(redis_url)
    SimpleWorker([stage_queue("init", slot_client)], connection=slot_client, name="status-probe.0").register_birth()
    assert [w.name for w in stage_workers("init", api_client)] == ["status-probe.0"]
    assert api_client.connection_pool.connection_kwargs["socket_timeout"] == 0.5
    api_client.close()
    slot_client.close()


def test_every_client_bounds_how_long_a_dead_network_path_to_redis_goes_unnoticed(redis_url: str) -> None:
    # A worker cut off from Redis mid-write otherwise waits out the kernel's retransmissions (~15 min).
    settings = Settings(redis_url=redis_url, redis_tcp_user_timeout_s=12)
    for client in (connect(settings), connect_for_requests(settings)):
        client.ping()
        connection = client.connection_pool.get_connection()
        try:
            sock = connection._sock
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 12_000
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 6
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 2
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        finally:
            client.connection_pool.release(connection)
            client.close()
