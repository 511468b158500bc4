"""A small HTTP client for the CLI: submit, poll, status; retries connection errors with backoff."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx

from shared.config import Settings

POLL_CHUNK = 500


class ApiClient:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0, retries: int = 5) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)
        self.retries = retries

    @classmethod
    def from_settings(cls, settings: Settings, url: str | None = None) -> ApiClient:
        base = url or settings.api_url or f"http://{settings.api_host}:{settings.api_port}"
        token = settings.token or (settings.api_tokens[0] if settings.api_tokens else None)
        return cls(base, token)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
            else:
                if response.status_code != 503 or attempt == self.retries:
                    return response
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def submit(self, jobs: list[dict[str, Any]]) -> list[str]:
        response = self.request("POST", "/v1/jobs", json=jobs)
        if response.status_code != 202:
            raise ApiError(response)
        return response.json()["job_ids"]

    def summaries(self, job_ids: list[str]) -> Iterator[dict[str, Any]]:
        for start in range(0, len(job_ids), POLL_CHUNK):
            chunk = job_ids[start : start + POLL_CHUNK]
            response = self.request("GET", "/v1/jobs", params={"ids": ",".join(chunk), "limit": len(chunk)})
            if response.status_code != 200:
                raise ApiError(response)
            yield from response.json()["jobs"]

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.request("GET", f"/v1/jobs/{job_id}")
        if response.status_code != 200:
            raise ApiError(response)
        return response.json()

    def status(self) -> dict[str, Any]:
        response = self.request("GET", "/v1/status")
        if response.status_code != 200:
            raise ApiError(response)
        return response.json()

    def close(self) -> None:
        self.http.close()


class ApiError(RuntimeError):
    def __init__(self, response: httpx.Response) -> None:
        errors: list[dict[str, Any]] = []
        try:
            body = response.json()
            detail = body.get("detail", response.text)
            errors = [e for e in body.get("errors") or [] if isinstance(e, dict)]
        except (ValueError, AttributeError):
            detail = response.text
        super().__init__(f"HTTP {response.status_code}: {detail}")
        self.status_code = response.status_code
        self.errors = errors  # {field, message} per problem, on a 422
