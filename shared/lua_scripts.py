"""The one way to load a Redis Lua script: a `.lua` file beside the module that runs it, read as package
data and registered with the connection (EVALSHA, falling back to EVAL once per server).

Every atomic step the service takes in Redis is a file, so each can be read, reviewed and tested as
Lua; a script that shares helpers names the file that holds them first.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from redis import Redis
from redis.commands.core import Script


@cache
def lua_source(package: str, *names: str) -> str:
    """The text of `package`'s `.lua` files `names`, joined in order (shared helpers first)."""
    return "\n".join(resources.files(package).joinpath(name).read_text() for name in names)


def register_lua(redis: Redis, package: str, *names: str) -> Script:
    """`lua_source(package, *names)` registered with `redis`: call it as `script(keys=[...], args=[...])`."""
    return redis.register_script(lua_source(package, *names))
