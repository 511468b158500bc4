"""What an LLM server says about itself over HTTP, asked one way everywhere: is it healthy (vLLM's
GET /health), which models it serves (GET /v1/models, with each model's local `root`), and which
weight version it holds (vLLM's GET /weight_info).

The pool's health probes, registration (the API), `rollouts register`, the local stack and its
vLLM launcher all ask through here, with the node gateway's bearer key where one is set.
"""

from __future__ import annotations

import httpx

from shared.errors import RolloutsError


class ProbeError(RolloutsError):
    """The server did not answer as an OpenAI-compatible one does; the message says what it answered."""


def backend_auth(key: str | None) -> dict[str, str]:
    """The header a node gateway (gateway/) asks for; none where the key is unset (a vLLM server called
    directly, on loopback or a trusted network)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def probe_health(url: str, timeout_s: float, key: str | None = None) -> str | None:
    """GET <url>/health as vLLM serves it; None when healthy, else the reason."""
    try:
        response = httpx.get(url.rstrip("/") + "/health", timeout=timeout_s, headers=backend_auth(key))
    except httpx.HTTPError as exc:
        return f"probe failed: {type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return f"probe failed: /health answered {response.status_code}"
    return None


def served_models(url: str, timeout_s: float, key: str | None = None) -> dict[str, str]:
    """GET <url>/v1/models: each served model's name -> its `root` (vLLM's local path of it; "" if none).

    Raises ProbeError when the server is unreachable or its answer is not an OpenAI-compatible model list.
    """
    try:
        response = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s, headers=backend_auth(key))
        cards = response.json()["data"] if response.status_code == 200 else None
        served = {str(card["id"]): str(card.get("root") or "") for card in cards} if cards is not None else None
    except (httpx.HTTPError, httpx.InvalidURL, ValueError, KeyError, TypeError) as exc:
        raise ProbeError(
            f"{url!r} did not answer GET /v1/models as an OpenAI-compatible server does ({type(exc).__name__}: {exc})"
        ) from None
    if served is None:
        raise ProbeError(
            f"{url} answered GET /v1/models with {response.status_code}, not an OpenAI-compatible model list"
        )
    return served


def served_weight_version(url: str, timeout_s: float, key: str | None = None) -> str | None:
    """The weight version the server reports (vLLM's GET /weight_info); None when it does not say (not a
    vLLM, no dev routes, unreachable)."""
    try:
        response = httpx.get(url.rstrip("/") + "/weight_info", timeout=timeout_s, headers=backend_auth(key))
        return response.json().get("weight_version") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
