"""OpenAPI additions: the jobs POST body is parsed by hand (one job or a list), so describe it here."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import TypeAdapter

from shared.jobs.spec import JobRequest

REF_TEMPLATE = "#/components/schemas/{model}"


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
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
