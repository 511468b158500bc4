"""The gateway's ASGI app: check the token and the route, then stream the call through to vLLM.

Answers are streamed chunk by chunk as vLLM writes them (server-sent events, long generations),
never buffered; request bodies are read whole, since a control call's body is checked first and
a data call's is a prompt. A caller that goes away ends its call upstream at once (vLLM aborts a
request whose connection closes). Plain ASGI on one pooled aiohttp session to the loopback server:
every call pays the proxy's own CPU time, which on a CPU-bound node is taken from vLLM, so what a
framework would add per call is left out (measured: docs/BENCHMARKS.md, "Node gateway").
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from dataclasses import dataclass

import aiohttp
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from gateway.routes import ROUTES, ControlPolicy, Refused, Scope
from shared.config import Settings

log = logging.getLogger(__name__)

# Hop-by-hop headers (RFC 9110 7.6.1), never passed on either way; of a request also the ones the
# gateway's own client sets (and the caller's token). An answer keeps its content-length: framed by it,
# not chunked, it costs the gateway one write less.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = _HOP_BY_HOP | {"host", "authorization", "content-length"}


@dataclass(frozen=True)
class GatewayConfig:
    """One gateway: the vLLM server behind it, its two tokens and what a control call may ask for."""

    upstream: str
    data_token: str
    admin_token: str
    policy: ControlPolicy
    max_data_bytes: int
    max_control_bytes: int

    @classmethod
    def from_settings(cls, upstream: str, settings: Settings) -> GatewayConfig:
        if not settings.backend_token or not settings.backend_admin_token:
            missing = [
                name
                for name, value in (
                    ("ROLLOUTS_BACKEND_TOKEN", settings.backend_token),
                    ("ROLLOUTS_BACKEND_ADMIN_TOKEN", settings.backend_admin_token),
                )
                if not value
            ]
            raise ValueError(f"a node gateway needs both of its tokens; {' and '.join(missing)} not set")
        if settings.backend_token == settings.backend_admin_token:
            raise ValueError(
                "ROLLOUTS_BACKEND_TOKEN and ROLLOUTS_BACKEND_ADMIN_TOKEN must differ: every worker holds the first"
            )
        return cls(
            upstream=upstream.rstrip("/"),
            data_token=settings.backend_token,
            admin_token=settings.backend_admin_token,
            policy=ControlPolicy(list(settings.checkpoint_roots)),
            max_data_bytes=settings.max_body_bytes,
            # A bytes upload arrives base64 in a JSON envelope: 4/3 of the largest update the API sends.
            max_control_bytes=settings.max_weight_bytes * 4 // 3 + 64 * 1024,
        )


class Gateway:
    """The ASGI app. Its HTTP client to vLLM lives as long as the app, made in its event loop at start-up."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._upstream: aiohttp.ClientSession | None = None

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._handle(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._upstream = aiohttp.ClientSession(
                    base_url=self.config.upstream,
                    connector=aiohttp.TCPConnector(limit=0),  # as many connections to vLLM as calls in flight
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),  # the caller bounds a call
                    auto_decompress=False,  # bytes pass through as vLLM wrote them, with their content-encoding
                    trust_env=False,
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._upstream is not None:
                    await self._upstream.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _handle(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        assert self._upstream is not None, "served without its lifespan"
        method, path = scope["method"], scope["path"]
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        try:
            route = _authorize(method, path, headers, self.config)
            limit = self.config.max_control_bytes if route is Scope.CONTROL else self.config.max_data_bytes
            body = await _read_body(receive, headers, limit)
            if route is Scope.CONTROL:
                adapter = self.config.policy.check(path, body)
                if adapter is not None:
                    async with self._upstream.get("/v1/models") as models:
                        adapter.check(await models.json(content_type=None))
        except Refused as refused:
            return await _refuse(send, refused.status, refused.message)
        except (aiohttp.ClientError, ValueError) as exc:
            return await _refuse(send, 502, f"the vLLM server behind this gateway did not answer: {type(exc).__name__}")
        except _CallerGone:
            return
        query = scope["query_string"].decode("latin-1")
        target = path + (f"?{query}" if query else "")
        passed = [(name, value) for name, value in headers.items() if name not in _NOT_FORWARDED]
        await _relay(self._upstream, method, target, passed, body, receive, send)


class _CallerGone(Exception):
    """The caller closed its connection before its request was read."""


def _authorize(method: str, path: str, headers: dict[str, str], config: GatewayConfig) -> Scope:
    """The route's scope, if the caller's token opens it: 401 without a valid token (before anything is said about
    routes), 404 for a route the gateway does not forward, 403 with the data token on a control route."""
    token = _bearer(headers)
    is_admin = token is not None and hmac.compare_digest(token.encode(), config.admin_token.encode())
    is_data = token is not None and hmac.compare_digest(token.encode(), config.data_token.encode())
    if not (is_admin or is_data):
        raise Refused(401, "a gateway token is required: Authorization: Bearer <ROLLOUTS_BACKEND_TOKEN>")
    scope = ROUTES.get((method, path))
    if scope is None:
        raise Refused(404, f"{method} {path} is not forwarded by this gateway")
    if scope is Scope.CONTROL and not is_admin:
        raise Refused(403, f"{path} is a control route: it needs the admin token (ROLLOUTS_BACKEND_ADMIN_TOKEN)")
    return scope


def _bearer(headers: dict[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def _read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it passes `limit` (a Content-Length is not trusted)."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Refused(413, f"the body is {declared} bytes; this route takes at most {limit}")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _CallerGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"the body passed {limit} bytes, the most this route takes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _relay(
    upstream: aiohttp.ClientSession,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes,
    receive: Receive,
    send: Send,
) -> None:
    """Send the call to vLLM and its answer back chunk by chunk; stop both as soon as the caller leaves."""
    try:
        answer = await upstream.request(method, target, data=body or None, headers=headers, allow_redirects=False)
    except aiohttp.ClientError as exc:
        return await _refuse(send, 502, f"the vLLM server behind this gateway did not answer: {type(exc).__name__}")

    async def pump() -> None:
        passed = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in answer.headers.items()
            if k.lower() not in _HOP_BY_HOP
        ]
        await send({"type": "http.response.start", "status": answer.status, "headers": passed})
        async for chunk in answer.content.iter_any():  # each as it arrives
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    relaying = asyncio.ensure_future(pump())
    leaving = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait((relaying, leaving), return_when=asyncio.FIRST_COMPLETED)
    finally:
        relaying.cancel()
        leaving.cancel()
        outcomes = await asyncio.gather(relaying, leaving, return_exceptions=True)
    if relaying.cancelled() or outcomes[0] is not None:
        answer.close()  # the caller left, or vLLM broke off mid-answer: the call ends upstream too
        if isinstance(outcomes[0], Exception):
            log.warning("%s %s: the answer broke off: %s: %s", method, target, type(outcomes[0]).__name__, outcomes[0])
    else:
        answer.release()  # read to its end: the connection goes back to the pool


async def _disconnect(receive: Receive) -> None:
    """Returns when the caller has closed its connection (its request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _refuse(send: Send, status: int, message: str) -> None:
    """The OpenAI-style error body vLLM itself answers with, so a client reads both the same way."""
    kind = {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        502: "upstream_error",
    }.get(status, "invalid_request_error")
    payload = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
