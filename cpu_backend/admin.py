"""`POST /admin/load_weights`: a trainer hands the CPU backend new weights and a policy version.

A GRPO trainer updates the policy and must make the rollout backends sample from it.
This route loads a local Hugging Face model directory (what `save_pretrained` wrote),
swaps it into the engine between requests and clears the KV prefix cache (entries
computed by the old weights must not seed the new policy's generations). From then
on every response reports `version` as its `model`, which the agent loop records as
each turn's policy version. The route is off unless an admin token is configured.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from cpu_backend.engine import Engine, EngineRequestError


class LoadWeightsRequest(BaseModel):
    path: str = Field(description="A local HF causal-LM directory readable by the backend.")
    version: str = Field(min_length=1, max_length=200, description="The policy version to report from now on.")


def _load(path: Path):  # -> transformers.PreTrainedModel
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()


def admin_router(engine: Engine, admin_token: str | None) -> APIRouter:
    router = APIRouter()

    def refused(authorization: str | None) -> JSONResponse | None:
        if not admin_token:
            return JSONResponse({"error": "weight loading is off: start the backend with an admin token "
                                          "(--admin-token or ROLLOUTS_CPU_BACKEND_ADMIN_TOKEN)"}, status_code=403)
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), admin_token.encode()):
            return JSONResponse({"error": "a valid admin bearer token is required"}, status_code=401)
        return None

    @router.post("/admin/load_weights")
    async def load_weights(body: LoadWeightsRequest, request: Request,
                           authorization: str | None = Header(default=None)) -> JSONResponse:
        denied = refused(authorization)
        if denied is not None:
            return denied
        path = Path(body.path)
        if not (path / "config.json").is_file():
            return JSONResponse({"error": f"{path} is not a model directory (no config.json)"}, status_code=400)
        try:
            model = await run_in_threadpool(_load, path)  # outside the engine lock: generation goes on meanwhile
            await run_in_threadpool(engine.load_model, model, body.version)
        except EngineRequestError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except (OSError, ValueError) as exc:
            return JSONResponse({"error": f"cannot load {path}: {exc}"}, status_code=400)
        request.app.state.model_dir = path
        return JSONResponse({"version": engine.version, "path": str(path)})

    return router
