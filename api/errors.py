"""Error responses: every rejection is a 4xx whose message names the field; Redis trouble is a 503.

Bad input has one body (`Refusal`), whoever found it: pydantic, a route, a task kind.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from pydantic import ValidationError as PydanticValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.errors import StoredResultError, StoredResultGone, ValidationError


class Problem(BaseModel):
    field: str = Field(description="Where: a path into the request, such as `body[3].task.kind` or `query.status`.")
    message: str = Field(description="What is wrong there.")


class Refusal(BaseModel):
    """The body of every 422 (and of a 400 for malformed JSON): each problem, naming its field."""

    detail: str = Field(description="The first ten problems on one line: `field: message; ...`.")
    errors: list[Problem]


def problems_of(error: ValidationError) -> list[dict[str, str]]:
    """Each problem as {field, message}, the field a dotted path like `body[2].limits.max_turns`."""
    return [{"field": part.field or "body", "message": part.message} for part in error.errors]


def describe_errors(errors: list[dict[str, Any]], prefix: tuple[Any, ...] = ()) -> list[dict[str, str]]:
    """Pydantic errors as {field, message} pairs, without pydantic's "Value error, " in front."""
    return problems_of(ValidationError.from_pydantic(errors, prefix))


def validation_response(problems: list[dict[str, Any]], status_code: int = 422) -> JSONResponse:
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:10])
    return JSONResponse({"detail": summary, "errors": problems}, status_code=status_code)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ValidationError)
    async def _invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return validation_response(problems_of(exc))

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(describe_errors(list(exc.errors())))

    @app.exception_handler(PydanticValidationError)
    async def _model_invalid(request: Request, exc: PydanticValidationError) -> JSONResponse:
        return validation_response(describe_errors(list(exc.errors()), ("body",)))

    @app.exception_handler(StoredResultError)
    async def _stored_result(request: Request, exc: StoredResultError) -> JSONResponse:
        # Gone: expired or removed, as a 410 says; corrupt: the server's fault. Either names job and file.
        code = 410 if isinstance(exc, StoredResultGone) else 500
        return JSONResponse({"detail": str(exc), "job_id": exc.job_id, "file": exc.path}, status_code=code)

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def _redis_down(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            {"detail": f"the job store (Redis) is unavailable: {type(exc).__name__}; retry shortly"},
            status_code=503,
            headers={"Retry-After": "1"},
        )
