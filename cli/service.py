"""Commands that run the service: `up`, `api`, `worker`, and `run` (the whole stack for one batch)."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path
from types import FrameType

import click

from cli.connect import connect, is_loopback
from cli.stack import Stack, StackError
from cli.tracking import follow, read_jobs, submit_all, summary_table, write_results
from shared.config import STAGES, get_settings
from shared.logs import setup_logging
from shared.redis_conn import redact_url
from shared.tasks import UnknownKind, get_spec, load_task_modules


def stop_on_sigterm() -> None:
    """SIGTERM (a scheduler, `timeout`, `kill`) stops the stack as cleanly as Ctrl-C does."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def kill_on_next_interrupt(stack: Stack) -> None:
    """From now on a Ctrl-C or SIGTERM kills every service process at once and exits."""

    def kill_now(signum: int, frame: FrameType | None) -> None:
        click.echo(
            "second interrupt: killing the service processes now; jobs that were running are "
            "re-queued when workers next run",
            err=True,
        )
        stack.kill()
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, kill_now)
    signal.signal(signal.SIGTERM, kill_now)


def stop_in_order(stack: Stack) -> None:
    """Stop the stack in order (workers, backend, API, Redis last); a second Ctrl-C or SIGTERM
    meanwhile kills every service process at once and exits."""
    kill_on_next_interrupt(stack)
    stack.stop()


def banner(stack: Stack) -> str:
    """Where everything is, for a person: the API, its docs, the viewer, Redis (never its password)."""
    lines = [
        f"rollouts up: API {stack.api_url}",
        f"  docs      {stack.api_url}/docs",
        f"  viewer    {stack.api_url}/viewer",
        f"  submit    export ROLLOUTS_API_URL={stack.api_url}   # then `rollouts submit FILE`, `rollouts status`",
    ]
    if stack.redis_url_file is not None:
        lines.append(f"  redis     embedded; its URL with the password is in {stack.redis_url_file} (mode 0600)")
        lines.append(f"            export ROLLOUTS_REDIS_URL_FILE={stack.redis_url_file}   # for a second worker")
    else:
        lines.append(f"  redis     {redact_url(stack.redis_url)}")
    lines.append("  dashboard rollouts dashboard   # rq-dashboard on http://127.0.0.1:9181 (same Redis settings)")
    lines.append("Ctrl-C stops everything, Redis last.")
    return "\n".join(lines)


def _concurrency(init: int | None, rollout: int | None, eval_: int | None) -> dict[str, int]:
    return {k: v for k, v in {"init": init, "rollout": rollout, "eval": eval_}.items() if v}


_concurrency_options = [
    click.option("--init-concurrency", type=click.IntRange(min=1), help="Jobs in flight per init worker."),
    click.option("--rollout-concurrency", type=click.IntRange(min=1), help="Jobs in flight per rollout worker."),
    click.option("--eval-concurrency", type=click.IntRange(min=1), help="Jobs in flight per eval worker."),
]


def concurrency_options(fn):  # type: ignore[no-untyped-def]
    for option in reversed(_concurrency_options):
        fn = option(fn)
    return fn


@click.command()
@click.option("--port", type=int, default=None, help="API port (default: ROLLOUTS_API_PORT or 8000).")
@click.option("--workers-per-stage", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Serve this local Hugging Face model directory with vLLM (default: ROLLOUTS_VLLM_MODEL, "
    "else a tiny model built offline).",
)
@click.option(
    "--backend-url",
    "backend_urls",
    multiple=True,
    help="Use this already running vLLM server instead of starting one (repeatable).",
)
@click.option("--no-vllm", is_flag=True, help="Start no vLLM server (register backends with `rollouts register`).")
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="On Ctrl-C, seconds running jobs get to finish before the workers hand them back (they go on "
    "at the next `up`); ROLLOUTS_DRAIN_TIMEOUT_S stays the default of workers a scheduler stops.",
)
@click.option("--verbose", is_flag=True, help="Show rq's own per-job log lines (ROLLOUTS_RQ_LOG_LEVEL=INFO).")
@concurrency_options
def up(
    port: int | None,
    workers_per_stage: int,
    model: Path | None,
    backend_urls: tuple[str, ...],
    no_vllm: bool,
    drain_timeout: float,
    verbose: bool,
    init_concurrency: int | None,
    rollout_concurrency: int | None,
    eval_concurrency: int | None,
) -> None:
    """Start Redis (if none is configured), the API and a worker fleet per stage; Ctrl-C stops them all."""
    # Started in the background by a non-interactive shell, we would inherit SIGINT ignored: take it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    settings = get_settings()
    stack = Stack(
        settings,
        api_port=port,
        concurrency=_concurrency(init_concurrency, rollout_concurrency, eval_concurrency),
        workers_per_stage=workers_per_stage,
        persistent_redis=True,
        vllm=not no_vllm and not backend_urls,
        model=model,
        backend_urls=list(backend_urls),
        on_progress=lambda message: click.echo(f"  {message}", err=True),
        drain_timeout_s=drain_timeout,
        extra_env={"ROLLOUTS_RQ_LOG_LEVEL": "INFO"} if verbose else {},
    )
    stop_on_sigterm()
    try:
        stack.start()
    except StackError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:  # Ctrl-C while vLLM loads or the workers start: start() stopped what it
        click.echo("stopped before the stack was up (interrupted)", err=True)  # had started, in order
        return
    click.echo(banner(stack))
    try:
        stack.supervise()  # every process that dies is restarted (cli/supervision.py); only Ctrl-C ends `up`
    except KeyboardInterrupt:
        # Armed before saying so: a Ctrl-C right after "Ctrl-C again" must kill, not raise in here.
        kill_on_next_interrupt(stack)
        click.echo(
            "stopping: workers finish or hand back their jobs, then the backend, the API, and Redis last "
            "(Ctrl-C again to kill them now)...",
            err=True,
        )
    finally:
        stop_in_order(stack)
    click.echo("stopped", err=True)


@click.command()
@click.option("--host", default=None, help="Bind address (default: ROLLOUTS_API_HOST).")
@click.option("--port", type=int, default=None, help="Port (default: ROLLOUTS_API_PORT).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="uvicorn processes.")
def api(host: str | None, port: int | None, workers: int) -> None:
    """Serve the HTTP API (uvicorn)."""
    import uvicorn

    settings = get_settings()
    setup_logging(settings)
    host = host or settings.api_host
    if not settings.api_tokens and not settings.admin_tokens and not is_loopback(host) and not settings.allow_open_api:
        raise click.ClickException(
            f"refusing to serve the API on {host} with no tokens: anyone who can reach it could submit, cancel and "
            "update weights. Set ROLLOUTS_API_TOKENS and ROLLOUTS_ADMIN_TOKENS, bind 127.0.0.1 "
            "(ROLLOUTS_API_HOST), or set ROLLOUTS_ALLOW_OPEN_API=1 for a network you trust."
        )
    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=host,
        port=port if port is not None else settings.api_port,
        workers=workers,
        log_level=settings.log_level.lower(),
        access_log=False,
    )


@click.command()
@click.argument("stage", type=click.Choice(STAGES))
@click.option(
    "--concurrency", type=click.IntRange(min=1), default=None, help="Jobs in flight (default: per stage setting)."
)
@click.option("--drain-timeout", type=float, default=None, help="Seconds to finish jobs on SIGTERM (default: setting).")
def worker(stage: str, concurrency: int | None, drain_timeout: float | None) -> None:
    """Run one worker process of a stage."""
    from workers.runtime.main import run_worker

    run_worker(stage, concurrency, drain_timeout)


def _needs_llm(jobs: list[dict], task_modules: list[str]) -> bool:
    """Whether any job's kind runs an agent, so the embedded stack needs a model backend."""
    load_task_modules(task_modules)
    kinds = {job.get("task", {}).get("kind") for job in jobs if isinstance(job, dict)}
    for kind in kinds:
        try:
            if get_spec(str(kind)).uses_llm:
                return True
        except UnknownKind:
            continue  # the API rejects unknown kinds with a clear message
    return False


@click.command()
@click.argument("jobs_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write every finished job as JSONL.")
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds.")
@concurrency_options
def run(
    jobs_file: Path,
    output: Path | None,
    timeout: float | None,
    init_concurrency: int | None,
    rollout_concurrency: int | None,
    eval_concurrency: int | None,
) -> None:
    """Bring up the whole stack, run JOBS_FILE (JSONL) through it, print a summary, and tear it down."""
    settings = get_settings()
    try:
        jobs = read_jobs(jobs_file)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    log_dir = Path(tempfile.mkdtemp(prefix="rollouts-run-"))
    stack = Stack(
        settings,
        api_port=0,
        concurrency=_concurrency(init_concurrency, rollout_concurrency, eval_concurrency),
        log_dir=log_dir,
        vllm=_needs_llm(jobs, settings.task_modules),
        on_progress=lambda message: click.echo(f"  {message}", err=True),
    )
    click.echo(f"starting the stack (logs in {log_dir}) ...", err=True)
    stop_on_sigterm()
    try:
        stack.start()
        client = connect(stack.api_url, settings)
        ids = submit_all(client, jobs)
        click.echo(f"submitted {len(ids)} jobs", err=True)
        finished = follow(client, ids, timeout=timeout)
        click.echo(summary_table([finished[i] for i in dict.fromkeys(ids)]))
        if output:
            write_results(client, ids, output)
            click.echo(f"wrote {len(ids)} results to {output}", err=True)
    except (StackError, TimeoutError) as exc:
        raise click.ClickException(f"{exc} (logs in {log_dir})") from None
    finally:
        stack.stop()
