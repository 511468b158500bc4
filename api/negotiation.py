"""JSON by default, msgpack when the client asks for it (`Accept: application/msgpack`).

Trajectories are long lists of ints and floats; msgpack is several times
smaller and faster to decode on the trainer side.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response

from shared.codec import MSGPACK_MEDIA_TYPE, pack


def wants_msgpack(request: Request) -> bool:
    return MSGPACK_MEDIA_TYPE in request.headers.get("accept", "")


def respond(request: Request, payload: Any, status_code: int = 200) -> Response:
    if wants_msgpack(request):
        return Response(pack(payload), status_code=status_code, media_type=MSGPACK_MEDIA_TYPE)
    return Response(orjson.dumps(payload), status_code=status_code, media_type="application/json")
