"""The embedded Redis is bounded and never evicts; old records still read their reward."""

from __future__ import annotations

import os

from redis import Redis

from cli.embedded_redis import EmbeddedRedis
from shared.codec import pack
from shared.config import Settings
from shared.jobs.store import reward_of


def test_the_embedded_redis_runs_with_its_maxmemory_and_noeviction() -> None:
    with EmbeddedRedis(maxmemory=64 * 1024**2) as server:
        client = Redis.from_url(server.url)
        assert client.config_get("maxmemory")["maxmemory"] == str(64 * 1024**2)
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        client.close()


def test_the_default_maxmemory_is_a_share_of_this_machine() -> None:
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert Settings(redis_maxmemory_fraction=0.5).redis_maxmemory() == physical // 2
    assert Settings(redis_maxmemory_bytes=12345).redis_maxmemory() == 12345


def test_a_record_written_before_the_results_store_still_gives_its_reward() -> None:
    assert reward_of(pack(0.5), None) == 0.5
    assert reward_of(None, pack({"reward": 0.25, "details": "..."})) == 0.25
    assert reward_of(None, None) is None
