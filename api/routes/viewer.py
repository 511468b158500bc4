"""A small trajectory viewer: one static page that reads the jobs API from the browser.

The page holds no data, so it is served without auth; its requests to /v1/jobs carry the
token the user enters (kept in the tab's sessionStorage, or given once as `#token=...`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

router = APIRouter(tags=["viewer"], include_in_schema=False)

PAGE = Path(__file__).resolve().parent.parent / "static" / "viewer.html"


@lru_cache(maxsize=1)
def _page() -> str:
    return PAGE.read_text()


@router.get("/viewer", response_class=HTMLResponse)
def viewer() -> HTMLResponse:
    """List jobs; `#job=<id>` opens one: turns, tool calls, reward, token counts."""
    return HTMLResponse(_page(), headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


@router.get("/viewer/")
def viewer_slash() -> RedirectResponse:
    return RedirectResponse("/viewer")
