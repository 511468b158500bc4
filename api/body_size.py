"""Reject oversized request bodies before they are read into memory (413, not a slow 500)."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodySizeLimit:
    """Pure ASGI middleware: checks Content-Length up front and counts chunked bodies as they stream."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        seen = 0
        responded = False

        async def counting_receive() -> Message:
            nonlocal seen, responded
            message = await receive()
            if message["type"] == "http.request" and not responded:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # Answer now and tell the app the client is gone, so it stops reading.
                    responded = True
                    await self._reject(send)
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

    async def _reject(self, send: Send) -> None:
        message = f"request body exceeds the limit of {self.max_bytes} bytes"
        body = json.dumps({"detail": message, "errors": [{"field": "body", "message": message}]}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
