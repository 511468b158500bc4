"""Run a gateway in a thread of the process that registers its backend (`rollouts register --gateway`).

One process per backend does both, so the gateway lives exactly as long as the registration: the
registrar's signal handling stays where it is (the main thread), deregisters first, and only then
stops the gateway, while the pool no longer routes to it.
"""

from __future__ import annotations

from gateway.app import Gateway, GatewayConfig
from shared.thread_server import ThreadServer


def gateway_server(config: GatewayConfig, host: str, port: int) -> ThreadServer:
    """The gateway's uvicorn on `host:port`, to `start()` and `stop()`, tuned to cost each call as little as it can."""
    return ThreadServer(
        Gateway(config),
        host,
        port,
        name="gateway",
        # What a call costs the proxy: no forwarded-for rewriting, and the answer's own date and
        # server headers pass through instead of a second pair.
        proxy_headers=False,
        server_header=False,
        date_header=False,
        # Longer than the callers' own keep-alive (httpx: 5 s), so an idle connection is closed by the
        # caller: one the gateway closed just as a call went out on it would fail that call.
        timeout_keep_alive=75,
    )
