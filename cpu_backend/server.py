"""The CPU backend's HTTP server: vLLM's OpenAI-compatible endpoints over the CPU engine.

Endpoints as vLLM serves them: POST /v1/completions, GET /v1/models, GET /health (200,
empty body), GET /version, GET /metrics (Prometheus text with the vLLM metric names this
engine can honour). Errors use vLLM's ErrorResponse body; bad requests are 400, an unknown
model is 404, as in vLLM.
"""

from __future__ import annotations

import logging
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.concurrency import run_in_threadpool

from cpu_backend.admin import admin_router
from cpu_backend.engine import Engine, EngineRequestError, Generation, SamplingParams
from cpu_backend.protocol import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    PromptTokenUsageInfo,
    UsageInfo,
)

log = logging.getLogger("rollouts.cpu_backend")


class _Metrics:
    """vLLM's metric names (docs.vllm.ai, "Production Metrics"), labelled by model_name as vLLM does."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Requests running.", labels, registry=r).labels(model_name)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting.", labels, registry=r).labels(model_name)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "Fraction of prefix-cache entries in use.", labels,
                              registry=r).labels(model_name)
        # prometheus_client appends _total to counters: vllm:prompt_tokens_total etc.
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels,
                                     registry=r).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens processed.", labels,
                                         registry=r).labels(model_name)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      labels, registry=r).labels(model_name)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels,
                                   registry=r).labels(model_name)
        self.success = Counter("vllm:request_success", "Finished requests.", labels + ["finished_reason"],
                               registry=r)
        self.model_name = model_name
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                              registry=r).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels,
                             registry=r).labels(model_name)

    def record(self, generation: Generation, cache_fill: float) -> None:
        self.prompt_tokens.inc(generation.prompt_tokens)
        self.generation_tokens.inc(sum(len(s.token_ids) for s in generation.samples))
        self.prefix_queries.inc(generation.prompt_tokens)
        self.prefix_hits.inc(generation.cached_tokens)
        for sample in generation.samples:
            self.success.labels(self.model_name, sample.finish_reason).inc()
        self.ttft.observe(generation.first_token_s)
        self.e2e.observe(generation.total_s)
        self.kv_usage.set(cache_fill)


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    body = ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=status))
    return JSONResponse(body.model_dump(), status_code=status)


def _sampling(request: CompletionRequest) -> SamplingParams:
    stop = request.stop if isinstance(request.stop, list) else ([request.stop] if request.stop else [])
    return SamplingParams(
        max_tokens=request.max_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=request.top_k or 0,
        min_p=request.min_p or 0.0,
        seed=request.seed,
        n=request.n,
        stop=tuple(stop),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens,
        logprobs=request.logprobs,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
    )


def create_app(engine: Engine, served_model_name: str, model_dir: Path, admin_token: str | None = None) -> FastAPI:
    """The served name is the initial policy version; POST /admin/load_weights replaces both (admin.py)."""
    app = FastAPI(title="rollouts CPU backend (vLLM protocol)")
    metrics = _Metrics(served_model_name)
    engine.version = engine.version or served_model_name
    app.state.engine = engine
    app.state.served_model_name = served_model_name
    app.state.model_dir = model_dir
    app.include_router(admin_router(engine, admin_token))
    try:
        server_version = version("rollouts")
    except PackageNotFoundError:
        server_version = "0"

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:2]) or None
        return _error(400, f"{first.get('msg', 'invalid request')} ({param})", param)

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
        # Anything else unexpected: vLLM's ErrorResponse body, never Starlette's plain text.
        log.error("request failed: %s: %s", type(exc).__name__, exc)
        return _error(500, f"{type(exc).__name__}: {exc}")

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    def get_version() -> dict[str, str]:
        return {"version": server_version}

    @app.get("/v1/models")
    def models() -> dict:
        card = ModelCard(id=engine.version, root=str(app.state.model_dir), max_model_len=engine.max_model_len)
        return ModelList(data=[card]).model_dump()

    @app.get("/metrics")
    def get_metrics() -> Response:
        metrics.running.set(engine.running)
        metrics.waiting.set(engine.waiting)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> Response:
        if request.model is not None and request.model != engine.version:
            return _error(404, f"The model `{request.model}` does not exist.", "model")
        if request.stream:
            return _error(400, "streaming is not supported by the CPU backend", "stream")
        if request.echo:
            return _error(400, "echo is not supported by the CPU backend", "echo")
        prompts = _prompts(request.prompt, engine)
        if not prompts or any(not p for p in prompts):
            return _error(400, "Prompt cannot be empty", "prompt")  # as vLLM answers prompt=[] / ""
        params = _sampling(request)
        started = time.time()
        choices: list[CompletionResponseChoice] = []
        prompt_tokens = cached_tokens = completion_tokens = 0
        served_as = ""  # the version of the weights that generated the first choice (reloads swap between requests)
        for prompt in prompts:
            try:
                generation = await run_in_threadpool(engine.generate, prompt, params)
            except EngineRequestError as exc:
                return _error(400, str(exc), exc.param)
            except Exception as exc:  # noqa: BLE001 - vLLM answers an engine failure with a JSON 500
                log.exception("generation failed")
                return _error(500, f"{type(exc).__name__}: {exc}")
            metrics.record(generation, len(engine.prefix_cache) / max(engine.prefix_cache.capacity, 1))
            served_as = served_as or generation.version
            prompt_tokens += generation.prompt_tokens
            cached_tokens += generation.cached_tokens
            for sample in generation.samples:
                completion_tokens += len(sample.token_ids)
                choices.append(CompletionResponseChoice(
                    index=len(choices),
                    text=sample.text,
                    logprobs=_logprobs(sample, engine, request) if request.logprobs is not None else None,
                    finish_reason=sample.finish_reason,
                    stop_reason=sample.stop_reason,
                    token_ids=sample.token_ids if request.return_token_ids else None,
                    prompt_token_ids=prompt if request.return_token_ids else None,
                ))
        response = CompletionResponse(
            created=int(started),
            model=served_as or engine.version,
            choices=choices,
            usage=UsageInfo(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
                prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=cached_tokens),
            ),
        )
        return JSONResponse(response.model_dump())

    return app


def _prompts(prompt: list[int] | list[list[int]] | str | list[str], engine: Engine) -> list[list[int]]:
    """Token-ID prompts pass through untouched; text prompts are tokenized as vLLM does."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and isinstance(prompt[0], int):
        return [list(prompt)]  # type: ignore[arg-type]
    return [list(p) if isinstance(p, list) else engine.tokenizer.encode(p) for p in prompt]  # type: ignore[union-attr]


def _token_text(token: int, engine: Engine, as_ids: bool) -> str:
    return f"token_id:{token}" if as_ids else engine.tokenizer.decode([token])


def _logprobs(sample, engine: Engine, request: CompletionRequest) -> CompletionLogProbs:
    as_ids = bool(request.return_tokens_as_token_ids)
    tokens = [_token_text(t, engine, as_ids) for t in sample.token_ids]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return CompletionLogProbs(
        text_offset=offsets,
        token_logprobs=list(sample.logprobs),
        tokens=tokens,
        top_logprobs=[{_token_text(t, engine, as_ids): v for t, v in top.items()} for top in sample.top_logprobs],
    )
