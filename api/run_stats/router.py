"""The run page's numbers: `GET /v1/run-stats` for a batch, a run or a time window, as JSON or CSV.

Read from the aggregates that job ends keep in Redis (shared/run_stats/), never from the job records,
so the page can refresh it every few seconds while a run goes on.
"""

from __future__ import annotations

import re
import time
from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from api.deps import get_store, require_auth
from api.negotiation import respond
from shared.jobs.store import JobStore
from shared.run_stats.view import csv_text, run_stats, window_of

router = APIRouter(prefix="/v1", tags=["runs"], dependencies=[Depends(require_auth)])


@router.get("/run-stats", summary="A batch's, a run's or a time window's numbers, for the run page (JSON or CSV)")
def get_run_stats(
    request: Request,
    store: JobStore = Depends(get_store),
    batch_id: str | None = Query(default=None, min_length=1, max_length=200, description="A batch's id."),
    run_id: str | None = Query(default=None, min_length=1, max_length=200, description="The jobs' metadata.run_id."),
    since: float | None = Query(default=None, description="Epoch seconds; default: the scope's start, or an hour ago."),
    until: float | None = Query(default=None, description="Epoch seconds; default: now."),
    format: Literal["json", "csv"] = Query(default="json", description="csv: the same numbers as one long table."),
) -> Response:
    """Reward per weight version and per kind, jobs per minute, stage times (p50/p90), tokens per second,
    the LLM's share of the rollout stage, staleness, failure reasons and sandbox pool hits (docs/OBSERVABILITY.md)."""
    window = window_of(batch_id, run_id, since, until, time.time())
    stats = run_stats(store, window)
    if format == "csv":
        name = re.sub(r"[^A-Za-z0-9._-]", "_", window.scope)
        disposition = f'attachment; filename="run-stats-{name}.csv"'
        return Response(
            csv_text(stats), media_type="text/csv; charset=utf-8", headers={"Content-Disposition": disposition}
        )
    return respond(request, stats)
