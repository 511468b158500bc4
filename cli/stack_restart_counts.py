"""How many times `rollouts up` restarted each kind of process, kept in Redis for `rollouts status`."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from redis.exceptions import RedisError

from shared.config import Settings
from shared.errors import RolloutsError
from shared.keys import Keys
from shared.redis_conn import connect


class RestartCounts:
    """Successful restarts by kind (GET /v1/status), mirrored to Redis; `redis_settings` names the Redis the
    stack's processes use (its own, once it started one)."""

    def __init__(self, redis_settings: Callable[[], Settings], lock: threading.RLock) -> None:
        self._redis_settings = redis_settings
        self._lock = lock
        self._counts: Counter[str] = Counter()
        self._unsaved = False

    def reset(self) -> None:
        """This stack's restarts, from 0, written over a count an earlier run left."""
        self._unsaved = True
        self.save()

    def counted(self, kind: str, restart: Callable[[], str]) -> Callable[[], str]:
        """`restart`, counted by kind once it succeeded."""

        def run() -> str:
            outcome = restart()
            with self._lock:
                self._counts[kind] += 1
                self._unsaved = True
            self.save()
            return outcome

        return run

    def save(self) -> None:
        """Write the counts to Redis when they changed; a write that fails (Redis is itself down or
        restarting) is tried again on the next supervision round, so no restart goes uncounted."""
        with self._lock:
            if not self._unsaved:
                return
            counts = dict(self._counts)
        settings = self._redis_settings()
        try:
            with connect(settings) as redis:
                key = Keys(settings.redis_prefix).stack_restarts
                pipe = redis.pipeline()
                pipe.delete(key)
                if counts:
                    pipe.hset(key, mapping=counts)
                pipe.execute()
        except (RedisError, RolloutsError):
            return
        with self._lock:
            self._unsaved = self._counts != Counter(counts)
