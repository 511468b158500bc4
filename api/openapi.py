"""OpenAPI additions: what FastAPI cannot see for itself.

The jobs POST body is parsed by hand (one job or a list), so it is described here; and every error
response is the API's own `Refusal`, not FastAPI's default HTTPValidationError or `{"detail"}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import TypeAdapter

from api.errors import Refusal
from shared.jobs.spec import JobRequest

REF_TEMPLATE = "#/components/schemas/{model}"
# Every error a route declares has the Refusal body (api/errors.py sends nothing else).
REFUSAL_CODES = ("400", "401", "403", "404", "409", "410", "413", "415", "422", "500", "503")


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        body = TypeAdapter(JobRequest | list[JobRequest]).json_schema(ref_template=REF_TEMPLATE)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(body.pop("$defs", {}))
        post = schema["paths"]["/v1/jobs"]["post"]
        post["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
        _describe_refusals(schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _describe_refusals(schema: dict[str, Any]) -> None:
    """Point every declared error at `Refusal`, the body api/errors.py really sends, and drop FastAPI's own."""
    components = schema["components"]["schemas"]
    refusal = Refusal.model_json_schema(ref_template=REF_TEMPLATE)
    components.update(refusal.pop("$defs", {}))
    components["Refusal"] = refusal
    ref = REF_TEMPLATE.format(model="Refusal")
    for operations in schema["paths"].values():
        for operation in operations.values():
            for code in REFUSAL_CODES:
                if code in operation.get("responses", {}):
                    operation["responses"][code]["content"] = {"application/json": {"schema": {"$ref": ref}}}
    for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's shape, which no route sends
        components.pop(name, None)
