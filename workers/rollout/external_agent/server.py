"""The HTTP face of one job's ExternalAgentSession, served by its rollout worker on a port of its own.

The API forwards the agent's calls here (api/routes/external_agent.py) after checking the job's credential; the
key is checked here again, since this port is reachable on the worker's network too. Routes stay
thin: parse, call the session, answer; a ExternalAgentError becomes the called format's error body
(OpenAI's, or Anthropic's on /v1/messages) with its status. The Responses and Messages routes
translate to the session's one chat call (responses_api.py, anthropic_api.py): one record, one rule.
A streamed chat, Responses or Messages call runs as a StreamedCall (streaming.py): its events
follow the tokens as the backend generates them.
"""

from __future__ import annotations

import re
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.external_agent_credentials import CONVERSATION_HEADER, JOB_HEADER, credential_opens, presented_credential
from workers.rollout.external_agent import anthropic_api, responses_api, wire
from workers.rollout.external_agent.session import ExternalAgentSession
from workers.rollout.external_agent.streaming import StreamedCall, chat_stream

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:/@-]{1,128}")


class FinishRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: str | None = None


def build_app(session: ExternalAgentSession, job_id: str, secret: bytes, task: Callable[[], dict[str, Any]]) -> FastAPI:
    """The app of one job: chat/completions, completions, models, the task, tools, finish."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.add_middleware(NamesJob, job_id=job_id)

    async def authorized(request: Request) -> None:
        key = presented_credential(request.headers.get("authorization"), request.headers.get("x-api-key"))
        if key is None:
            raise wire.ExternalAgentError(
                401,
                "this job's credential is required: Authorization: Bearer <agent.api_key> (or x-api-key: <agent.api_key>)",
                None,
                "authentication_error",
            )
        if not credential_opens(secret, job_id, key):
            raise wire.ExternalAgentError(403, "this credential does not open this job", None, "permission_error")

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

    guard = [Depends(authorized)]

    async def unblocked(call: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """On the loop (no thread hop) unless a streamed call holds the session: waiting for it there would
        stop that stream's chunks, so then from the thread pool."""
        return await run_in_threadpool(call, *args) if session.busy else call(*args)

    # One server per job and its calls serialized by the session: a call may run on the server's own
    # loop (the thread pool hop cost ~2 ms a call; nothing else of this job could run meanwhile anyway).
    @app.post("/v1/chat/completions", dependencies=guard)
    async def chat(request: Request) -> Any:
        call = _parse(wire.ChatRequest, await request.body())
        conversation = _conversation(request)
        if call.stream and session.generate_stream is not None:
            streamed = StreamedCall(lambda on_progress: session.chat(call, conversation, on_progress))
            opened = await streamed.opened()
            if opened is not None:
                return _sse(chat_stream(streamed, opened, session.model))
            response = streamed.result
        else:
            response = await unblocked(session.chat, call, conversation)
        return _sse(wire.chat_chunks(response)) if call.stream else JSONResponse(response)

    @app.post("/v1/completions", dependencies=guard)
    async def completions(request: Request) -> Any:
        call = _parse(wire.CompletionRequest, await request.body())
        response = await unblocked(session.complete, call, _conversation(request))
        return _sse(wire.text_chunks(response)) if call.stream else JSONResponse(response)

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

        if call.stream and session.generate_stream is not None:
            streamed = StreamedCall(lambda on_progress: session.chat(chat_call, conversation, on_progress))
            opened = await streamed.opened()
            if opened is not None:
                return _sse(responses_api.stream_events(streamed, opened, call, response_id, session.model, respond))
            chat = streamed.result
        else:
            chat = await unblocked(session.chat, chat_call, conversation)
        response = respond(chat)
        return _sse(responses_api.events(response)) if call.stream else JSONResponse(response)

    @app.post("/v1/messages", dependencies=guard)
    async def messages(request: Request) -> Any:
        call = _parse(anthropic_api.MessagesRequest, await request.body())
        conversation = _conversation(request)
        chat_call = anthropic_api.chat_request(call)
        if call.stream and session.generate_stream is not None:
            streamed = StreamedCall(lambda on_progress: session.chat(chat_call, conversation, on_progress))
            opened = await streamed.opened()
            if opened is not None:
                return _sse(anthropic_api.stream_events(streamed, opened, call, session.model))
            chat = streamed.result
        else:
            chat = await unblocked(session.chat, chat_call, conversation)
        message = anthropic_api.message_of(chat, call)
        return _sse(anthropic_api.events(message)) if call.stream else JSONResponse(message)

    @app.get("/v1/models", dependencies=guard)
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": session.model, "object": "model", "owned_by": "rollouts"}]}

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

    return app


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


class ThreadServer:
    """uvicorn serving one app from a thread, on a port the OS picks (bound before the thread starts)."""

    def __init__(self, app: FastAPI, host: str, lifespan: str = "off") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self._socket.listen(128)  # connections wait in the backlog until uvicorn accepts them, never refused
        self.port = self._socket.getsockname()[1]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan=lifespan, access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True, name=f"external-agent-{self.port}"
        )

    def start(self, timeout_s: float = 30.0) -> ThreadServer:
        """Start serving; returns once uvicorn has started (or raises if it could not)."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the agent endpoint on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
