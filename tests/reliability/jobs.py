"""Submitting many scripted jobs and waiting for all of them, polling in bulk."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.waiting import TERMINAL, wait_for


def scripted_jobs(n: int, trace: Path | None, sleep: dict[str, float]) -> list[dict[str, Any]]:
    task: dict[str, Any] = {"kind": "scripted", "sleep": sleep}
    if trace is not None:
        task["trace"] = str(trace)
    return [{"task": task, "idempotency_key": f"reliability-{i}"} for i in range(n)]


def submit(api: httpx.Client, jobs: list[dict[str, Any]], chunk: int = 100) -> list[str]:
    ids: list[str] = []
    for start in range(0, len(jobs), chunk):
        response = api.post("/v1/jobs", json=jobs[start : start + chunk])
        response.raise_for_status()
        ids += response.json()["job_ids"]
    return ids


def statuses(api: httpx.Client, ids: list[str], chunk: int = 100) -> dict[str, str]:
    """id -> status for every id the API still knows (GET /v1/jobs?ids=...)."""
    out: dict[str, str] = {}
    for start in range(0, len(ids), chunk):
        response = api.get("/v1/jobs", params={"ids": ",".join(ids[start : start + chunk]), "limit": chunk})
        response.raise_for_status()
        out.update({row["id"]: row["status"] for row in response.json()["jobs"]})
    return out


def wait_all_terminal(api: httpx.Client, ids: list[str], timeout: float) -> dict[str, str]:
    def finished() -> dict[str, str] | None:
        try:
            seen = statuses(api, ids)
        except httpx.HTTPError:
            return None  # the API or Redis is restarting: ask again
        return seen if len(seen) == len(ids) and all(s in TERMINAL for s in seen.values()) else None

    started = time.monotonic()
    result = wait_for(finished, timeout=timeout, interval=0.5, what=f"{len(ids)} jobs to finish")
    assert time.monotonic() - started <= timeout
    return result
