"""The CLI's RolloutClient: where the API is and which token to send, from the server's Settings.

The CLI makes every API call through rollouts_client, the trainer's own client, so both see
the same retries, errors and msgpack/JSON decoding.
"""

from __future__ import annotations

import ipaddress
import socket

import httpx

from rollouts_client import RolloutClient
from shared.config import Settings, get_settings


def is_loopback(host: str) -> bool:
    """Whether a bind address is reachable from this machine only (what may go unauthenticated)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def advertised_host(bound: str) -> str:
    """The name others reach a server bound to `bound` by: the machine's own name for a wildcard."""
    return socket.gethostname() if bound in ("0.0.0.0", "::", "") else bound


def url_host(url: str) -> str:
    """The host of an http(s) URL (no port, no brackets)."""
    return httpx.URL(url).host


def api_url(settings: Settings, url: str | None = None) -> str:
    """`url` if given, else the configured API URL, else the API's own host and port."""
    return url or settings.api_url or f"http://{settings.api_host}:{settings.api_port}"


def connect(url: str | None = None, settings: Settings | None = None, token: str | None = None) -> RolloutClient:
    """A client for `url` (default: api_url) with `token`, else the CLI's token, else the first API token."""
    settings = settings or get_settings()
    token = token or settings.token or next(iter(settings.api_tokens), None)
    return RolloutClient(api_url(settings, url), token)


def connect_admin(url: str | None, settings: Settings, token: str | None = None) -> RolloutClient:
    """The same with an admin token when none is given (registering backends needs the admin scope)."""
    token = token or settings.token or next(iter(settings.admin_tokens or settings.api_tokens), None)
    return RolloutClient(api_url(settings, url), token)
