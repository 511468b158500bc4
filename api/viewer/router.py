"""A small trajectory viewer: one static page that reads the jobs API from the browser.

The page and its scripts hold no data, so they are served without auth; their requests to
/v1/jobs carry the token the user enters (kept in the tab's sessionStorage, or given once as
`#token=...`). Everything is served from here, nothing from a CDN: the page works offline.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

router = APIRouter(tags=["viewer"], include_in_schema=False)

STATIC = Path(__file__).resolve().parent.parent / "static"  # api/static/
PAGE = STATIC / "viewer.html"

CSS, JS = "text/css; charset=utf-8", "text/javascript; charset=utf-8"
# The page's own files and the charting library it vendors (static/vendor/README.md), by name:
# nothing else under static/ is served.
ASSETS = {
    "viewer.css": ("viewer.css", CSS),
    "viewer.js": ("viewer.js", JS),
    "job.js": ("job.js", JS),
    "turns.js": ("turns.js", JS),
    "run.js": ("run.js", JS),
    "uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", JS),
    "uPlot.min.css": ("vendor/uPlot.min.css", CSS),
}
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


@cache
def _read(path: Path) -> str:
    return path.read_text()


@router.get("/viewer", response_class=HTMLResponse)
def viewer() -> HTMLResponse:
    """List jobs; `#job=<id>` opens one: turns, tool calls, evaluation, attempts, timings, errors;
    `#run` the run page: a batch's, a run's or a time window's plots (GET /v1/run-stats)."""
    return HTMLResponse(_read(PAGE), headers=_HEADERS)


@router.get("/viewer/assets/{name}")
def viewer_asset(name: str) -> Response:
    asset = ASSETS.get(name)
    if asset is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no viewer asset {name!r}")
    path, media_type = asset
    return Response(_read(STATIC / path), media_type=media_type, headers=_HEADERS)


@router.get("/viewer/")
def viewer_slash() -> RedirectResponse:
    return RedirectResponse("/viewer")
