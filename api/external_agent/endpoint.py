"""What a trainer hands an `agent: external` job's agent: the job's base URL on this API and its token."""

from __future__ import annotations

from fastapi import Request

from shared.external_agent_tokens import deployment_secret, job_token
from shared.jobs.store import JobStore


def endpoint(request: Request, job_id: str, secret: bytes) -> dict[str, str]:
    """The job's `base_url` and `api_key`."""
    settings = request.app.state.settings
    api = (settings.api_url or str(request.base_url)).rstrip("/")
    return {"base_url": f"{api}/v1/jobs/{job_id}/agent", "api_key": job_token(secret, job_id)}


def secret_of(request: Request) -> bytes:
    """The deployment's token secret, read once per API process (it never changes while Redis keeps it)."""
    secret = getattr(request.app.state, "agent_secret", None)
    if secret is None:
        store: JobStore = request.app.state.store
        secret = request.app.state.agent_secret = deployment_secret(store.redis, store.keys, store.settings)
    return secret
