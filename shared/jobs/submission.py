"""A submission's body turned into stored jobs: one job or a list, each job's key, conflicts named where they lie.

Each job is checked first (shared/tasks/validation.py, by the API's router, which names every problem).
"""

from __future__ import annotations

from typing import Any

from shared.errors import ValidationError
from shared.jobs.store import IdempotencyConflict, JobStore, Submitted


def with_request_key(body: Any, key: str) -> Any:
    """The Idempotency-Key header as the jobs' own keys, where they have none."""
    if isinstance(body, dict):
        return {"idempotency_key": key, **body}
    if isinstance(body, list):
        return [
            {"idempotency_key": f"{key}/{i}", **job} if isinstance(job, dict) else job for i, job in enumerate(body)
        ]
    return body


def job_items(body: Any) -> list[Any]:
    """The body's jobs: a list's items, or the one job; ValidationError at `body` for anything else or none."""
    if not isinstance(body, (list, dict)):
        raise ValidationError("expected a job object or a list of jobs", ("body",))
    items = body if isinstance(body, list) else [body]
    if not items:
        raise ValidationError("the list of jobs is empty", ("body",))
    return items


def submit_jobs(store: JobStore, specs: list[dict[str, Any]], many: bool) -> list[Submitted]:
    """Store and queue the jobs; an idempotency key held by another job is refused where the body names it."""
    try:
        return store.submit(specs)
    except IdempotencyConflict as exc:
        raise (
            exc.within("body") if many else IdempotencyConflict(exc.key, exc.job_id, ("body", "idempotency_key"))
        ) from None
