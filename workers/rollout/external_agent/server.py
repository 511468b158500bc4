"""The HTTP face of one job's ExternalAgentSession, served by its rollout worker on a port of its own.

The API forwards the agent's calls here (api/routes/external_agent.py) after checking the job's token; the
key is checked here again, since this port is reachable on the worker's network too. Routes stay
thin: parse, call the session, answer; a ExternalAgentError becomes the called format's error body
(OpenAI's, or Anthropic's on /v1/messages) with its status. The Responses and Messages routes
translate to the session's one chat call (responses_api.py, anthropic_api.py): one record, one rule.
A streamed chat, Responses or Messages call runs as a StreamedCall (streaming.py): its events
follow the tokens as the backend generates them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.external_agent_tokens import CONVERSATION_HEADER, JOB_HEADER, presented_token, token_opens
from shared.thread_server import ThreadServer
from workers.rollout.external_agent import anthropic_api, responses_api, wire
from workers.rollout.external_agent.session import ExternalAgentSession
from workers.rollout.external_agent.streaming import Progress, StreamedCall, chat_stream

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:/@-]{1,128}")


class FinishRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: str | None = None


def build_app(session: ExternalAgentSession, job_id: str, secret: bytes, task: Callable[[], dict[str, Any]]) -> FastAPI:
    """The app of one job: chat/completions, completions, responses, messages, models, the task, tools, finish."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.add_middleware(NamesJob, job_id=job_id)
    _answer_errors(app, job_id)
    guard = [Depends(_authorizer(job_id, secret))]
    calls = _Calls(session)
    _openai_routes(app, calls, guard)
    _format_routes(app, calls, guard)
    _job_routes(app, session, task, guard)
    return app


def endpoint_server(app: FastAPI, host: str) -> ThreadServer:
    """The job's endpoint served from a thread, on a port the OS picks: `start()` it, then hand out its `url`."""
    return ThreadServer(app, host, name="external-agent", lifespan="off")


def _authorizer(job_id: str, secret: bytes) -> Callable[[Request], Awaitable[None]]:
    """The dependency every route has: the job's token, as a bearer token or an x-api-key."""

    async def authorized(request: Request) -> None:
        key = presented_token(request.headers.get("authorization"), request.headers.get("x-api-key"))
        if key is None:
            raise wire.ExternalAgentError(
                401,
                "this job's token is required: Authorization: Bearer <agent.api_key> (or x-api-key: <agent.api_key>)",
                None,
                "authentication_error",
            )
        if not token_opens(secret, job_id, key):
            raise wire.ExternalAgentError(403, "this token does not open this job", None, "permission_error")

    return authorized


def _answer_errors(app: FastAPI, job_id: str) -> None:
    """A refusal in the called format's error body, and any other failure as the service's (502), said so."""

    @app.exception_handler(wire.ExternalAgentError)
    async def _refused(request: Request, exc: wire.ExternalAgentError) -> JSONResponse:
        return _error(request, exc)

    @app.exception_handler(Exception)
    async def _failed(request: Request, exc: Exception) -> JSONResponse:  # an infrastructure failure, said so
        failed = _error(
            request,
            wire.ExternalAgentError(
                502, f"the service failed this call: {type(exc).__name__}: {exc}", None, "server_error"
            ),
        )
        failed.headers[JOB_HEADER] = job_id  # answered outside NamesJob (Starlette's outermost error middleware)
        return failed


StreamEvents = Callable[[StreamedCall, Progress], AsyncIterator[str]]


class _Calls:
    """How a route calls the session: on the server's loop, or from the thread pool while a streamed call
    holds it; a streamed chat as its events while it is generated.

    One server per job and its calls serialized by the session: a call may run on the server's own
    loop (the thread pool hop cost ~2 ms a call; nothing else of this job could run meanwhile anyway)."""

    def __init__(self, session: ExternalAgentSession) -> None:
        self.session = session

    async def unblocked(self, call: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """On the loop (no thread hop) unless a streamed call holds the session: waiting for it there would
        stop that stream's chunks, so then from the thread pool."""
        return await run_in_threadpool(call, *args) if self.session.busy else call(*args)

    async def chat(
        self, call: wire.ChatRequest, conversation: str | None, stream: bool, events: StreamEvents
    ) -> dict[str, Any] | StreamingResponse:
        """The chat.completion of `call`; streamed (`stream`, and the backend streams), its `events` as it is
        generated, unless it ended before it opened (then the whole answer, as unstreamed)."""
        session = self.session
        if not (stream and session.generate_stream is not None):
            return await self.unblocked(session.chat, call, conversation)
        streamed = StreamedCall(lambda on_progress: session.chat(call, conversation, on_progress))
        opened = await streamed.opened()
        if opened is not None:
            return _sse(events(streamed, opened))
        return streamed.result


def _openai_routes(app: FastAPI, calls: _Calls, guard: list[Any]) -> None:
    """OpenAI's chat/completions, completions and models."""
    session = calls.session

    @app.post("/v1/chat/completions", dependencies=guard)
    async def chat(request: Request) -> Any:
        call = _parse(wire.ChatRequest, await request.body())
        response = await calls.chat(
            call,
            _conversation(request),
            call.stream,
            lambda streamed, opened: chat_stream(streamed, opened, session.model),
        )
        if isinstance(response, StreamingResponse):
            return response
        return _sse(wire.chat_chunks(response)) if call.stream else JSONResponse(response)

    @app.post("/v1/completions", dependencies=guard)
    async def completions(request: Request) -> Any:
        call = _parse(wire.CompletionRequest, await request.body())
        response = await calls.unblocked(session.complete, call, _conversation(request))
        return _sse(wire.text_chunks(response)) if call.stream else JSONResponse(response)

    @app.get("/v1/models", dependencies=guard)
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": session.model, "object": "model", "owned_by": "rollouts"}]}


def _format_routes(app: FastAPI, calls: _Calls, guard: list[Any]) -> None:
    """OpenAI's Responses and Anthropic's Messages, each a translation to and from the one chat call."""
    session = calls.session
    history = responses_api.ResponseHistory()  # previous_response_id, per job

    @app.post("/v1/responses", dependencies=guard)
    async def responses(request: Request) -> Any:
        call = _parse(responses_api.ResponsesRequest, await request.body())
        conversation = _conversation(request)
        earlier = history.conversation(call.previous_response_id) if call.previous_response_id else []
        chat_call, skip = responses_api.chat_request(call, earlier)
        response_id = f"resp_{uuid.uuid4().hex}"

        def respond(chat: dict[str, Any]) -> dict[str, Any]:
            response = responses_api.response_of(chat, call, response_id)
            if call.store:
                history.keep(response_id, responses_api.conversation_after(chat_call, skip, chat))
            return response

        def events(streamed: StreamedCall, opened: Progress) -> AsyncIterator[str]:
            return responses_api.stream_events(streamed, opened, call, response_id, session.model, respond)

        chat = await calls.chat(chat_call, conversation, call.stream, events)
        if isinstance(chat, StreamingResponse):
            return chat
        response = respond(chat)
        return _sse(responses_api.events(response)) if call.stream else JSONResponse(response)

    @app.post("/v1/messages", dependencies=guard)
    async def messages(request: Request) -> Any:
        call = _parse(anthropic_api.MessagesRequest, await request.body())
        conversation = _conversation(request)
        chat = await calls.chat(
            anthropic_api.chat_request(call),
            conversation,
            call.stream,
            lambda streamed, opened: anthropic_api.stream_events(streamed, opened, call, session.model),
        )
        if isinstance(chat, StreamingResponse):
            return chat
        message = anthropic_api.message_of(chat, call)
        return _sse(anthropic_api.events(message)) if call.stream else JSONResponse(message)


def _job_routes(
    app: FastAPI, session: ExternalAgentSession, task: Callable[[], dict[str, Any]], guard: list[Any]
) -> None:
    """The service's own: the task, its tools, and finish."""

    @app.get("/task", dependencies=guard)
    def the_task() -> dict[str, Any]:
        return task()

    @app.post("/tools/{name}", dependencies=guard)
    def run_tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return session.run_tool(name, arguments)

    @app.post("/finish", dependencies=guard)
    def finish(body: FinishRequest | None = None) -> dict[str, Any]:
        session.finish(body.answer if body is not None else None)
        return {"finished": True}


class NamesJob:
    """Names the job in every answer (`x-rollouts-job`): the API relays only answers from the job's own
    endpoint, so a remembered address now held by another server fails safe (api/external_agent_routes.py)."""

    def __init__(self, app: ASGIApp, job_id: str) -> None:
        self.app = app
        self.header = (JOB_HEADER.encode(), job_id.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        await self.app(scope, receive, named if scope["type"] == "http" else send)


def _error(request: Request, error: wire.ExternalAgentError) -> JSONResponse:
    """The refusal in the called format's own error body: Anthropic's on /v1/messages, OpenAI's elsewhere."""
    anthropic = request.url.path.rstrip("/").endswith("/v1/messages")
    return JSONResponse(anthropic_api.error_body(error) if anthropic else error.body(), status_code=error.status)


def _conversation(request: Request) -> str | None:
    """The conversation the call names (`x-rollouts-conversation`), if any: 1 to 128 printable ASCII characters."""
    name = request.headers.get(CONVERSATION_HEADER)
    if name is None:
        return None
    if not _CONVERSATION_ID.fullmatch(name):
        raise wire.ExternalAgentError(
            400, "a conversation id is 1 to 128 letters, digits or ._:/@- characters", CONVERSATION_HEADER
        )
    return name


def _parse(model: type[BaseModel], body: bytes) -> Any:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:  # name the first field it refused (invalid JSON: no field)
        first = exc.errors()[0]
        raise wire.ExternalAgentError(400, f"{first['msg']}", ".".join(str(p) for p in first["loc"]) or None) from None


def _sse(lines: Iterable[str] | AsyncIterator[str]) -> StreamingResponse:
    if isinstance(lines, AsyncIterator):
        return StreamingResponse(lines, media_type="text/event-stream")

    def chunks() -> Iterator[str]:
        yield from lines

    return StreamingResponse(chunks(), media_type="text/event-stream")
