"""A batch's completed groups as its Redis Stream reports them, read by waiting trainers without a thread each.

Long polls and server-sent events wait on the stream with redis.asyncio (XREAD BLOCK) on the API's
event loop, so a waiting trainer holds a connection but no threadpool thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis as AsyncRedis

from shared.batches.status import BatchStatus
from shared.config import Settings
from shared.keys import BatchKeys
from shared.redis_conn import MAX_CONNECTIONS

_RUNNING = BatchStatus.RUNNING.value.encode()  # as the async client reads the status field: bytes


@dataclass(frozen=True)
class StreamPage:
    """[(entry id, prompt index)] of the groups read, the cursor after them, and whether the batch has ended."""

    entries: list[tuple[str, int]]
    cursor: str
    ended: bool


def stream_client(settings: Settings) -> AsyncRedis:
    """A redis.asyncio client for the streams' blocking reads (one per API process)."""
    # Reads block for up to a long-poll's wait (at most 60 s): the socket timeout must outlast that.
    # Every waiting long-poll holds a connection: redis-py 8's default cap of 100 would fail the 101st.
    return AsyncRedis.from_url(
        settings.redis_url, health_check_interval=30, socket_timeout=90, max_connections=MAX_CONNECTIONS
    )


class GroupStream:
    """Reads of batches' streams of completed groups."""

    def __init__(self, redis: AsyncRedis, keys: BatchKeys) -> None:
        self.redis = redis
        self.keys = keys

    async def read(self, batch_id: str, cursor: str, count: int, block_s: float) -> StreamPage:
        """The groups after `cursor`, waiting up to `block_s` for one while the batch runs."""
        stream, key, count = self.keys.stream(batch_id), self.keys.batch(batch_id), max(1, count)
        if await self.redis.hget(key, "status") == _RUNNING:
            block_ms = int(block_s * 1000)
            reply = await self.redis.xread({stream: cursor}, count=count, block=block_ms if block_ms > 0 else None)
            if not reply and await self.redis.hget(key, "status") == _RUNNING:
                return StreamPage([], cursor, False)
        else:
            reply = None
        if not reply:
            # Closed. A batch closes and writes its `end` entry in one script, so one more read
            # decides: entries still after the cursor are returned, else the end was already read.
            reply = await self.redis.xread({stream: cursor}, count=count)
            if not reply:
                return StreamPage([], cursor, True)
        entries: list[tuple[str, int]] = []
        for _, items in reply:
            for entry_id_raw, fields in items:
                cursor = entry_id_raw.decode()
                kind = fields.get(b"type")
                if kind == b"group":
                    entries.append((cursor, int(fields[b"k"])))
                elif kind == b"end":
                    return StreamPage(entries, cursor, True)
        return StreamPage(entries, cursor, False)
