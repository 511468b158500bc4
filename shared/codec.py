"""msgpack encoding for everything the service stores in Redis or sends on request.

msgpack keeps token-ID lists compact (small ints are 1 byte) and round-trips
bytes, ints and floats exactly, which JSON does not for large trajectories.
"""

from __future__ import annotations

from typing import Any

import msgpack

MSGPACK_MEDIA_TYPE = "application/msgpack"


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes | None) -> Any:
    if data is None:
        return None
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
