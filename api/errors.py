"""Error responses: every rejection is a 4xx whose message names the field; Redis trouble is a 503."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


def describe_errors(errors: list[dict[str, Any]], prefix: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Pydantic errors as {field, message} pairs with a dotted path like `body[2].limits.max_turns`."""
    out = []
    for error in errors:
        path = ""
        for part in (*prefix, *error.get("loc", ())):
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        out.append({"field": path or "body", "message": error.get("msg", "invalid")})
    return out


def validation_response(problems: list[dict[str, Any]], status_code: int = 422) -> JSONResponse:
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:10])
    return JSONResponse({"detail": summary, "errors": problems}, status_code=status_code)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(describe_errors(list(exc.errors())))

    @app.exception_handler(ValidationError)
    async def _model_invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return validation_response(describe_errors(list(exc.errors()), ("body",)))

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def _redis_down(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            {"detail": f"the job store (Redis) is unavailable: {type(exc).__name__}; retry shortly"},
            status_code=503,
            headers={"Retry-After": "1"},
        )
