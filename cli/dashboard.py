"""`rollouts dashboard`: rq-dashboard against the service's Redis, so operators see queue depths and workers."""

from __future__ import annotations

import os
import sys

import click

from shared.config import get_settings
from shared.redis_conn import redact_url


def dashboard_argv(host: str, port: int, allow_delete: bool) -> list[str]:
    """The rq-dashboard command; the Redis URL goes through its environment, never argv (`ps` shows argv)."""
    argv = [sys.executable, "-m", "rq_dashboard", "--bind", host, "--port", str(port)]
    if not allow_delete:
        # Deleting or emptying rq jobs behind the service's back would orphan job records.
        argv.append("--disable-delete")
    return argv


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 exposes it).")
@click.option("--port", default=9181, show_default=True, type=int)
@click.option("--allow-delete", is_flag=True, help="Let the dashboard delete jobs and empty registries.")
def dashboard(host: str, port: int, allow_delete: bool) -> None:
    """Start rq-dashboard on the configured Redis (ROLLOUTS_REDIS_URL). Basic auth: RQ_DASHBOARD_USERNAME/_PASSWORD."""
    settings = get_settings()
    if not settings.redis_url:
        raise click.ClickException("ROLLOUTS_REDIS_URL is not set (the address `rollouts up` printed)")
    env = {**os.environ, "RQ_DASHBOARD_REDIS_URL": settings.redis_url}
    click.echo(f"rq-dashboard on http://{host}:{port} for Redis {redact_url(settings.redis_url)}", err=True)
    os.execve(sys.executable, dashboard_argv(host, port, allow_delete), env)
