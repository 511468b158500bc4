"""A stage's record write across a Redis restart in the middle of a transaction that runs a Lua script.

redis-py loads a pipeline's scripts once, before its first try; its retry after a lost connection sends
the transaction again to the restarted Redis, whose script cache is empty, and EXEC answers NOSCRIPT
for the script while applying the rest. Seen in the suite (test_redis_restart, a crash mid-run): the
rollout stage failed a job with NoScriptError. Here the restart's effect is made exactly: the cache
flushed after the pipeline was built and its own load skipped, against a real Redis.
"""

from __future__ import annotations

import threading

import pytest
from redis import Redis
from redis.exceptions import NoScriptError

from workers.runtime.held_writes import NOSCRIPT_TRIES, until_written

SET_STATUS = "redis.call('HSET', KEYS[1], 'status', ARGV[1]); return 1"


def transaction(redis: Redis, tries: list[int], lose_scripts_on: set[int]) -> list:
    """One try of the write: a queue entry and the scripted move in one MULTI/EXEC, as the stage runner's."""
    tries.append(len(tries) + 1)
    script = redis.register_script(SET_STATUS)
    with redis.pipeline(transaction=True) as pipe:
        pipe.rpush("test:queue", "job")
        script(keys=["test:job"], args=["eval"], client=pipe)
        if tries[-1] in lose_scripts_on:  # as after redis-py's retry on the restarted server
            redis.script_flush()
            pipe.load_scripts = lambda: None  # type: ignore[method-assign]
        return pipe.execute()


def test_a_write_whose_script_redis_lost_mid_transaction_is_tried_again(redis: Redis) -> None:
    tries: list[int] = []
    reply = until_written(lambda: transaction(redis, tries, {1}), "job j: the rollout result", threading.Event())
    assert tries == [1, 2]
    assert reply == [2, 1], "the second try's queue entry and move"
    assert redis.hget("test:job", "status") == b"eval"
    # The first try's queue entry went in without its move: the next stage skips a job not in its stage.
    assert redis.llen("test:queue") == 2


def test_scripts_lost_on_every_try_raise_after_a_few(redis: Redis) -> None:
    tries: list[int] = []
    lost_always = set(range(1, NOSCRIPT_TRIES + 2))
    with pytest.raises(NoScriptError):
        until_written(lambda: transaction(redis, tries, lost_always), "job j: the rollout result", threading.Event())
    assert len(tries) == NOSCRIPT_TRIES
