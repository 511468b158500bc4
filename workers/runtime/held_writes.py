"""A stage's record writes, held while Redis is up but refuses writes (its disk full: MISCONF).

A finished stage's result lives only in this worker's memory until its record is written. Failing
the job for it would make an infrastructure fault a failed job, and letting the error escape to rq
would throw the work away (rq's own bookkeeping fails too, the rq job is re-queued once Redis takes
writes again, and the stage runs again). So the write waits, with backoff, until Redis takes it.
Every write held here is all-or-nothing (one command, one script or one MULTI/EXEC), so trying it
again never applies half of it.

The same loop rides out a Redis restart under a transaction that runs a Lua script: redis-py loads a
pipeline's scripts once, before its first try, and its retry on a lost connection sends EXEC again to
the restarted server, whose script cache is empty (NOSCRIPT). A fresh pipeline loads them again, so the
write is simply tried again; the transaction's other commands (a queue entry) are ones the next stage
already tolerates twice (it skips a job that is not, or no longer, in its stage).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError, ResponseError

from shared.redis_conn import write_refusal
from workers.runtime.state import log

T = TypeVar("T")

# Between tries: from 0.1 s, doubling up to this (as a slot waiting for Redis), so a held write goes
# through within about a second of space returning, before maintenance takes its job for abandoned.
MAX_WAIT_S = 1.0
# Tries after NOSCRIPT: each fresh pipeline loads its scripts, so a second NOSCRIPT needs another restart.
NOSCRIPT_TRIES = 3


def until_written(write: Callable[[], T], what: str, stopping: threading.Event) -> T:
    """`write()`'s value once Redis takes it. Another error, or a refusal once the process is
    stopping, is raised: rq's failure path then hands the job back (workers/runtime/failure.py)."""
    backoff = ExponentialBackoff(cap=MAX_WAIT_S, base=0.1)
    refusals = noscripts = 0
    started = time.monotonic()
    while True:
        try:
            value = write()
        except NoScriptError:
            noscripts += 1
            if noscripts >= NOSCRIPT_TRIES:
                raise
            log.warning("%s: Redis lost its scripts (restarted mid-write); trying again", what)
            continue
        except ResponseError as exc:
            reason = write_refusal(exc)
            if reason is None or stopping.is_set():
                raise
            refusals += 1
            if refusals == 1:
                log.warning("%s held: Redis refuses writes (%s); retrying until it takes them", what, reason)
            stopping.wait(backoff.compute(refusals))
            continue
        if refusals:
            log.info("%s written after %.1f s held (%d refusals)", what, time.monotonic() - started, refusals)
        return value
