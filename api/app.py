"""The FastAPI application factory (`uvicorn --factory api.app:create_app`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from api.backends.router import router as backends_router
from api.batches.router import router as batches_router
from api.body_size import BodySizeLimit
from api.errors import install_error_handlers
from api.external_agent.router import router as external_agent_router
from api.jobs.router import router as jobs_router
from api.openapi import install_openapi
from api.run_stats.router import router as run_stats_router
from api.status.router import health_router, metrics_router, status_router
from api.viewer.router import router as viewer_router
from api.weights.router import WEIGHTS_PATH
from api.weights.router import router as weights_router
from shared.config import Settings, get_settings
from shared.jobs.store import JobStore
from shared.keys import Keys
from shared.redis_conn import connect_for_requests
from shared.tasks import load_task_modules

# Every router the app mounts, one area each (api/<area>/router.py); a new area adds its router here.
ROUTERS = [
    health_router,
    jobs_router,
    external_agent_router,
    status_router,
    backends_router,
    batches_router,
    metrics_router,
    run_stats_router,
    viewer_router,
    weights_router,
]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        load_task_modules(settings.task_modules)
        app.state.settings = settings
        app.state.keys = Keys(settings.redis_prefix)
        app.state.redis = connect_for_requests(settings)
        app.state.store = JobStore(app.state.redis, settings, app.state.keys)
        try:
            yield
        finally:
            app.state.redis.close()
            streams = getattr(app.state, "group_stream", None)  # made on first long-poll/SSE
            if streams is not None:
                await streams.redis.aclose()
            events = getattr(app.state, "job_events", None)  # made on first use: an agent's call, a long poll
            if events is not None:
                await events.stop()
            agent_http = getattr(app.state, "agent_http", None)  # made on an external agent's first call
            if agent_http is not None:
                await agent_http.close()
            fail_fast = getattr(app.state, "fail_fast_async_redis", None)  # likewise
            if fail_fast is not None:
                await fail_fast.aclose()

    # The /docs and /redoc pages load their scripts from the API itself (fastapi-offline ships them):
    # clusters and laptops without internet still get readable docs.
    app = FastAPIOffline(
        title="rollouts",
        summary="Rollout-as-a-service for RL training of multi-turn LLM agents",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.add_middleware(
        BodySizeLimit, max_bytes=settings.max_body_bytes, larger=(("PUT", WEIGHTS_PATH, settings.max_weight_bytes),)
    )
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    install_openapi(app)
    return app
