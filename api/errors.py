"""Error responses: every rejection is a 4xx whose message names the field; Redis trouble is a 503.

Every error has one body (`Refusal`: `detail`, and `errors` naming each field), whoever found it:
pydantic, a route, a task kind, auth, a missing id, the body-size cap, Redis being away or refusing writes
(its disk full), a weight update refused by shared/weights/.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from pydantic import ValidationError as PydanticValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.json_body import MalformedJSON
from shared.errors import NotPermitted, StoredResultError, StoredResultGone, ValidationError
from shared.jobs.store import IdempotencyConflict
from shared.redis_conn import write_refusal
from shared.weights import NoBackendsForModel, UpdateInProgress
from shared.weights.declare import BackendNotRegistered


class Problem(BaseModel):
    field: str = Field(description="Where: a path into the request, such as `body[3].task.kind` or `query.status`.")
    message: str = Field(description="What is wrong there.")


class Refusal(BaseModel):
    """The body of every error response (4xx and 5xx): each problem, naming its field."""

    detail: str = Field(description="The first ten problems on one line: `field: message; ...`.")
    errors: list[Problem]


def problems_of(error: ValidationError) -> list[dict[str, str]]:
    """Each problem as {field, message}, the field a dotted path like `body[2].limits.max_turns`."""
    return [{"field": part.field or "body", "message": part.message} for part in error.errors]


def describe_errors(errors: list[dict[str, Any]], prefix: tuple[Any, ...] = ()) -> list[dict[str, str]]:
    """Pydantic errors as {field, message} pairs, without pydantic's "Value error, " in front."""
    return problems_of(ValidationError.from_pydantic(errors, prefix))


def error_response(
    message: str,
    field: str,
    status_code: int,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JSONResponse:
    """An error that is not about the input's fields (a missing id, auth, Redis away), in the same shape;
    `extra` adds fields a caller can act on (the job and file of a lost result)."""
    body = {"detail": message, "errors": [{"field": field, "message": message}], **(extra or {})}
    return JSONResponse(body, status_code=status_code, headers=dict(headers or {}))


def validation_response(problems: list[dict[str, Any]], status_code: int = 422) -> JSONResponse:
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:10])
    return JSONResponse({"detail": summary, "errors": problems}, status_code=status_code)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ValidationError)
    async def _invalid(request: Request, exc: ValidationError) -> JSONResponse:
        forbidden = any(isinstance(part, NotPermitted) for part in exc.errors)  # not this caller's to set
        return validation_response(problems_of(exc), status_code=403 if forbidden else 422)

    @app.exception_handler(IdempotencyConflict)
    async def _conflict(request: Request, exc: IdempotencyConflict) -> JSONResponse:
        return validation_response(problems_of(exc), status_code=409)

    @app.exception_handler(MalformedJSON)
    async def _malformed(request: Request, exc: MalformedJSON) -> JSONResponse:
        return validation_response(problems_of(exc), status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(describe_errors(list(exc.errors())))

    @app.exception_handler(PydanticValidationError)
    async def _model_invalid(request: Request, exc: PydanticValidationError) -> JSONResponse:
        return validation_response(describe_errors(list(exc.errors()), ("body",)))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(str(exc.detail), _FIELD_OF_STATUS.get(exc.status_code, ""), exc.status_code, exc.headers)

    @app.exception_handler(StoredResultError)
    async def _stored_result(request: Request, exc: StoredResultError) -> JSONResponse:
        # Gone: expired or removed, as a 410 says; corrupt: the server's fault. Either names job and file.
        code = 410 if isinstance(exc, StoredResultGone) else 500
        return error_response(str(exc), "path", code, extra={"job_id": exc.job_id, "file": exc.path})

    @app.exception_handler(UpdateInProgress)
    @app.exception_handler(NoBackendsForModel)
    @app.exception_handler(BackendNotRegistered)
    async def _weights_refused(request: Request, exc: Exception) -> JSONResponse:
        # Another update of the model holds its lock (409), or the model or a backend is not registered (404).
        code = 409 if isinstance(exc, UpdateInProgress) else 404
        return error_response(str(exc), _FIELD_OF_STATUS[code], code)

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    @app.exception_handler(RedisResponseError)
    async def _redis_down(request: Request, exc: Exception) -> JSONResponse:
        # Away, or up but refusing writes it cannot keep (its disk full: MISCONF): either way nothing
        # was accepted and a retry will do once Redis recovers. Any other error reply is a bug: a 500.
        refusal = write_refusal(exc)
        if isinstance(exc, RedisResponseError) and refusal is None:
            raise exc
        cause = f"cannot keep writes: {refusal}" if refusal else f"is unavailable: {type(exc).__name__}"
        return error_response(f"the job store (Redis) {cause}; retry shortly", "", 503, {"Retry-After": "1"})


# Where an error that is not about one field of the input lies, as a Problem's `field`.
_FIELD_OF_STATUS = {
    401: "header.authorization",
    403: "header.authorization",
    404: "path",
    405: "method",
    409: "path",
    413: "body",
}
