"""The gateway's ASGI app: check the key and the route, then stream the call through to vLLM.

Answers are streamed chunk by chunk as vLLM writes them (server-sent events, long generations),
never buffered; request bodies are read whole, since a control call's body is checked first and
a data call's is a prompt. One pooled HTTP client to the loopback server keeps a call's added cost
to the proxying itself (docs/BENCHMARKS.md, node gateway).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.routes import ROUTES, ControlPolicy, Refused, Scope
from shared.config import Settings

log = logging.getLogger(__name__)

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the gateway sets itself, never passed on.
_DROPPED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "authorization", "content-length",
})  # fmt: skip


@dataclass(frozen=True)
class GatewayConfig:
    """One gateway: the vLLM server behind it, its two keys and what a control call may ask for."""

    upstream: str
    data_key: str
    admin_key: str
    policy: ControlPolicy
    max_data_bytes: int
    max_control_bytes: int

    @classmethod
    def from_settings(cls, upstream: str, settings: Settings) -> GatewayConfig:
        if not settings.backend_key or not settings.backend_admin_key:
            missing = [name for name, value in (("ROLLOUTS_BACKEND_KEY", settings.backend_key),
                                                ("ROLLOUTS_BACKEND_ADMIN_KEY", settings.backend_admin_key))
                       if not value]  # fmt: skip
            raise ValueError(f"a node gateway needs both of its keys; {' and '.join(missing)} not set")
        if settings.backend_key == settings.backend_admin_key:
            raise ValueError("ROLLOUTS_BACKEND_KEY and ROLLOUTS_BACKEND_ADMIN_KEY must differ: "
                             "every worker holds the first")  # fmt: skip
        return cls(
            upstream=upstream.rstrip("/"),
            data_key=settings.backend_key,
            admin_key=settings.backend_admin_key,
            policy=ControlPolicy(list(settings.checkpoint_roots)),
            max_data_bytes=settings.max_body_bytes,
            # A bytes upload arrives base64 in a JSON envelope: 4/3 of the largest update the API sends.
            max_control_bytes=settings.max_weight_bytes * 4 // 3 + 64 * 1024,
        )


def create_gateway(config: GatewayConfig) -> Starlette:
    """The app; its HTTP client to vLLM lives as long as the app."""
    upstream = httpx.AsyncClient(
        base_url=config.upstream,
        timeout=httpx.Timeout(None, connect=5.0),  # the caller bounds a call; a generation may take minutes
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        trust_env=False,
    )

    async def forward(request: Request) -> Response:
        try:
            scope = _authorize(request, config)
            body = await _read_body(request, config.max_control_bytes if scope is Scope.CONTROL
                                    else config.max_data_bytes)  # fmt: skip
            if scope is Scope.CONTROL:
                adapter = config.policy.check(request.url.path, body)
                if adapter is not None:
                    adapter.check((await upstream.get("/v1/models")).json())
        except Refused as refused:
            return _refusal(refused.status, refused.message)
        except httpx.HTTPError as exc:
            return _refusal(502, f"the vLLM server behind this gateway did not answer: {type(exc).__name__}")
        return await _stream(upstream, request, body)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await upstream.aclose()

    methods = sorted({method for method, _ in ROUTES} | {"PUT", "DELETE", "PATCH"})
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)


def _authorize(request: Request, config: GatewayConfig) -> Scope:
    """The route's scope, if the caller's key opens it: 401 without a valid key (before anything is said about
    routes), 404 for a route the gateway does not forward, 403 with the data key on a control route."""
    key = _bearer(request)
    is_admin = key is not None and hmac.compare_digest(key.encode(), config.admin_key.encode())
    is_data = key is not None and hmac.compare_digest(key.encode(), config.data_key.encode())
    if not (is_admin or is_data):
        raise Refused(401, "a gateway key is required: Authorization: Bearer <ROLLOUTS_BACKEND_KEY>")
    scope = ROUTES.get((request.method, request.url.path))
    if scope is None:
        raise Refused(404, f"{request.method} {request.url.path} is not forwarded by this gateway")
    if scope is Scope.CONTROL and not is_admin:
        raise Refused(403, f"{request.url.path} is a control route: it needs the admin key (ROLLOUTS_BACKEND_ADMIN_KEY)")
    return scope


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it passes `limit` (a Content-Length is not trusted)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Refused(413, f"the body is {declared} bytes; this route takes at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"the body passed {limit} bytes, the most this route takes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _stream(upstream: httpx.AsyncClient, request: Request, body: bytes) -> Response:
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROPPED]
    outgoing = upstream.build_request(request.method, request.url.path, params=request.url.query or None,
                                      headers=headers, content=body)  # fmt: skip
    try:
        answer = await upstream.send(outgoing, stream=True)
    except httpx.HTTPError as exc:
        return _refusal(502, f"the vLLM server behind this gateway did not answer: {type(exc).__name__}")

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:  # also when the caller goes away mid-stream: the connection goes back to the pool
            await answer.aclose()

    passed = {k: v for k, v in answer.headers.items() if k.lower() not in _DROPPED}
    return StreamingResponse(chunks(), status_code=answer.status_code, headers=passed)


def _refusal(status: int, message: str) -> JSONResponse:
    """The OpenAI-style error body vLLM itself answers with, so a client reads both the same way."""
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            413: "request_too_large", 502: "upstream_error"}.get(status, "invalid_request_error")  # fmt: skip
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)
