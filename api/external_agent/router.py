"""An external agent's endpoint: `/v1/jobs/{id}/agent/...`, every call forwarded to the worker serving its job.

The agent authenticates with its job's token, not an API token; forward.py says what is refused and how.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from api.deps import get_agent_endpoints
from api.external_agent.forward import forward
from shared.jobs.agent_endpoints import AgentEndpoints

router = APIRouter(prefix="/v1/jobs/{job_id}/agent", tags=["agent"])

_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "No token"},
    403: {"description": "Another job's token"},
    404: {"description": "No such job"},
    409: {"description": "The job's rollout has ended"},
    503: {"description": "The job's rollout is not serving yet (Retry-After), or its worker cannot be reached"},
}


@router.post(
    "/{path:path}",
    summary="An external agent's call to its job (chat/completions, completions, responses, messages, tools, finish)",
    responses=_RESPONSES,
)
async def post(
    job_id: str, path: str, request: Request, endpoints: AgentEndpoints = Depends(get_agent_endpoints)
) -> Response:
    """OpenAI's `v1/chat/completions`, `v1/completions` and `v1/responses`; Anthropic's `v1/messages`;
    `tools/{name}`; `finish`."""
    return await forward(job_id, path, request, endpoints)


@router.get("/{path:path}", summary="An external agent's read of its job (v1/models, task)", responses=_RESPONSES)
async def get(
    job_id: str, path: str, request: Request, endpoints: AgentEndpoints = Depends(get_agent_endpoints)
) -> Response:
    """`v1/models` and `task` (the job's messages, tool schemas and model)."""
    return await forward(job_id, path, request, endpoints)
