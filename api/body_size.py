"""Reject oversized request bodies before they are read into memory (413, not a slow 500)."""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodySizeLimit:
    """Pure ASGI middleware: checks Content-Length up front and counts chunked bodies as they stream.

    `larger`: (method, path pattern, limit) for the few routes whose body is data, not a request
    (weights sent as bytes); every other route keeps `max_bytes`.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, larger: tuple[tuple[str, str, int], ...] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.larger = [(method, re.compile(pattern), limit) for method, pattern, limit in larger]

    def _limit(self, scope: Scope) -> int:
        for method, pattern, limit in self.larger:
            if scope["method"] == method and pattern.fullmatch(scope["path"]):
                return limit
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self._limit(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._reject(send, max_bytes)
            return
        seen = 0
        responded = False

        async def counting_receive() -> Message:
            nonlocal seen, responded
            message = await receive()
            if message["type"] == "http.request" and not responded:
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    # Answer now and tell the app the client is gone, so it stops reading.
                    responded = True
                    await self._reject(send, max_bytes)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not responded:
                await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not responded:
                raise

    @staticmethod
    async def _reject(send: Send, max_bytes: int) -> None:
        message = f"request body exceeds the limit of {max_bytes} bytes"
        body = json.dumps({"detail": message, "errors": [{"field": "body", "message": message}]}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
