"""An external agent's call forwarded to the rollout worker serving its job (the routes: router.py).

The agent authenticates with its job's token (shared/external_agent_tokens.py), not an API token: the token opens
this one job and nothing else (as `Authorization: Bearer` or, for Anthropic clients, `x-api-key`).
The API checks it, finds where the job's rollout worker serves it (shared/jobs/agent_endpoints.py, remembered by
this process while it holds: endpoint_cache.py) and forwards the call there unchanged, streaming
the answer back; only an answer that names the job (`x-rollouts-job`) is relayed. Refusals are
OpenAI's error body (Anthropic's on `v1/messages`), so the agent's client shows the message:

- no token 401, another job's token 403, no such job 404;
- the rollout has ended (eval, done, failed, cancelled, timed out) 409;
- the rollout has not started serving yet (queued, init, sandbox starting) 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from api.external_agent.endpoint import secret_of
from api.external_agent.endpoint_cache import EndpointCache
from api.job_events import listener
from shared.external_agent_errors import anthropic_error, openai_error
from shared.external_agent_tokens import CONVERSATION_HEADER, JOB_HEADER, presented_token, token_opens
from shared.jobs.agent_endpoints import AgentEndpoints
from shared.jobs.status import JobStatus

_NOT_STARTED = (JobStatus.QUEUED, JobStatus.INIT, JobStatus.ROLLOUT)
_FORWARDED_HEADERS = ("authorization", "x-api-key", "content-type", "accept", CONVERSATION_HEADER)
# The call never left: safe to send again elsewhere. Anything else may have reached the worker.
_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


async def forward(job_id: str, path: str, request: Request, endpoints: AgentEndpoints) -> Response:
    """Check the token and the job's state, then forward the call to the worker serving the job.

    A route this process remembers (endpoint_cache.py) skips the Redis lookup; any doubt about it
    (the worker gone, not naming the job, or saying the rollout ended) drops it and looks again."""
    anthropic = path.rstrip("/") == "v1/messages"
    key = presented_token(request.headers.get("authorization"), request.headers.get("x-api-key"))
    if key is None:
        return _refusal(
            401,
            "the job's token is required: Authorization: Bearer <agent.api_key> (or x-api-key)",
            "authentication_error",
            anthropic=anthropic,
        )
    state = request.app.state
    secret = getattr(state, "agent_secret", None) or await run_in_threadpool(secret_of, request)
    if not token_opens(secret, job_id, key):
        return _refusal(403, "this token does not open this job", "permission_error", anthropic=anthropic)
    call = _Call(request, path, job_id, await request.body())
    routes = _routes(request)
    cached = routes.get(job_id)
    answer: aiohttp.ClientResponse | Exception | None = await _send(call, cached) if cached is not None else None
    if answer is not None:
        if isinstance(answer, aiohttp.ClientResponse) and _names_job(answer, job_id) and answer.status != 409:
            return await _relay(answer)
        # Moved, restarted, ended or gone. A 409 (its session refused the call before doing anything) may
        # come from an attempt superseded by another one: Redis says whether the job ended, as before.
        routes.drop(job_id)
        if isinstance(answer, aiohttp.ClientResponse):
            answer.release()
        elif not isinstance(answer, _NOT_SENT):  # it may have reached the worker: never sent twice
            return await _unreachable(endpoints, job_id, answer, anthropic)
    epoch = routes.epoch
    found = await endpoints.lookup(job_id)  # no route, or nothing was delivered on it: Redis says where
    if found.status is None:
        return _refusal(404, f"no job with id {job_id!r}", "not_found_error", anthropic=anthropic)
    if found.status not in _NOT_STARTED:
        return _refusal(409, f"this job's rollout has ended (status {found.status})", "conflict", anthropic=anthropic)
    if found.url is None:
        return _refusal(
            503,
            f"this job's rollout is not serving yet (status {found.status}); retry shortly",
            "service_unavailable",
            retry_after=1,
            anthropic=anthropic,
        )
    answer = await _send(call, found.url)
    if not isinstance(answer, aiohttp.ClientResponse):
        return await _unreachable(endpoints, job_id, answer, anthropic)
    if not _names_job(answer, job_id):  # the address is held by a server that is not this job's endpoint
        answer.release()
        return _refusal(
            503,
            "the worker serving this job cannot be reached: its address answers for another",
            "service_unavailable",
            retry_after=1,
            anthropic=anthropic,
        )
    if answer.status != 409:
        routes.put(job_id, found.url, epoch)
    return await _relay(answer)


async def _unreachable(endpoints: AgentEndpoints, job_id: str, error: Exception, anthropic: bool) -> JSONResponse:
    """409 if the rollout ended meanwhile, else 503: the worker could not be reached."""
    found = await endpoints.lookup(job_id)
    if found.status not in _NOT_STARTED:
        return _refusal(409, f"this job's rollout has ended (status {found.status})", "conflict", anthropic=anthropic)
    return _refusal(
        503,
        f"the worker serving this job cannot be reached: {type(error).__name__}",
        "service_unavailable",
        retry_after=1,
        anthropic=anthropic,
    )


def _routes(request: Request) -> EndpointCache:
    """This process's endpoint cache, subscribed to the jobs' events on first use."""
    return listener(request, "external_agent_routes", EndpointCache)


@dataclass(frozen=True)
class _Call:
    request: Request
    path: str
    job_id: str
    body: bytes


def _names_job(answer: aiohttp.ClientResponse, job_id: str) -> bool:
    return answer.headers.get(JOB_HEADER) == job_id


async def _send(call: _Call, base_url: str) -> aiohttp.ClientResponse | Exception:
    """The worker's answer (its body not read yet), or why it could not be reached."""
    headers = {name: value for name, value in call.request.headers.items() if name in _FORWARDED_HEADERS}
    try:
        return await _client(call.request).request(
            call.request.method,
            f"{base_url}/{call.path}",
            headers=headers,
            data=call.body,
            params=list(call.request.query_params.multi_items()) or None,
        )
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return exc


async def _relay(answer: aiohttp.ClientResponse) -> Response:
    kept = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type", "retry-after")}
    if not answer.headers.get("content-type", "").startswith("text/event-stream"):  # whole answers: one read
        try:
            return Response(await answer.read(), status_code=answer.status, headers=kept)
        finally:
            answer.release()
    return StreamingResponse(
        answer.content.iter_any(), status_code=answer.status, headers=kept, background=BackgroundTask(answer.release)
    )


def _client(request: Request) -> aiohttp.ClientSession:
    """One pooled client per API process (kept-alive connections to each worker). aiohttp, as the node
    gateway's: httpx's async pool cost more per call (docs/BENCHMARKS.md)."""
    client: aiohttp.ClientSession | None = getattr(request.app.state, "agent_http", None)
    if client is None:
        timeout = request.app.state.settings.llm_request_timeout_s + 60
        client = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=timeout),
            auto_decompress=False,
            trust_env=False,
        )
        request.app.state.agent_http = client
    return client


def _refusal(
    status: int, message: str, kind: str, retry_after: int | None = None, anthropic: bool = False
) -> JSONResponse:
    """OpenAI's error body, or Anthropic's for a `v1/messages` call."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = anthropic_error(message, kind) if anthropic else openai_error(status, message, kind)
    return JSONResponse(body, status_code=status, headers=headers)
