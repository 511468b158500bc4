"""`rollouts register`: what a vLLM launch script runs beside the server.

A vLLM launch script starts the server, then runs `rollouts register --backend-url ...` next
to it: the command waits for the server's /health, registers it with the API, heartbeats
until it gets SIGTERM/SIGINT (Slurm's scancel, Ctrl-C) and then deregisters, so the pool
never routes to a server that was stopped on purpose. Keeping it registered is the client's
one Registration (rollouts_client/registration.py), as for a trainer's own servers.
"""

from __future__ import annotations

import signal
import time

import click

from cli.connect import advertised_host, connect_admin
from gateway.app import GatewayConfig
from gateway.server import gateway_server
from rollouts_client.registration import Registration, RegistrationRefused
from shared.backend_pool.probe import probe_health
from shared.config import Settings, get_settings
from shared.thread_server import ThreadServer


def _labels(pairs: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--label")
        labels[key] = value
    return labels


def _wait_healthy(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if probe_health(url, 2.0) is None:
            return
        if time.monotonic() > deadline:
            raise click.ClickException(f"{url}/health did not answer 200 within {timeout_s:.0f}s")
        time.sleep(1.0)


_api_options = [
    click.option("--api-url", default=None, help="API URL (default: ROLLOUTS_API_URL or host:port settings)."),
    click.option("--token", default=None, help="Admin bearer token (default: ROLLOUTS_TOKEN / admin tokens)."),
    click.option(
        "--capacity",
        type=click.FloatRange(min=0, min_open=True),
        default=1.0,
        show_default=True,
        help="Relative weight in the pool (e.g. GPUs or max concurrent sequences).",
    ),
    click.option("--label", "labels", multiple=True, help="key=value, repeatable."),
]


def api_options(fn):  # type: ignore[no-untyped-def]
    for option in reversed(_api_options):
        fn = option(fn)
    return fn


@click.command("register")
@click.option(
    "--backend-url",
    required=True,
    help="Base URL of the vLLM server, e.g. http://$(hostname):8000; "
    "with --gateway, its loopback address (http://127.0.0.1:8000).",
)
@click.option("--model", required=True, help="Served model name (what vLLM reports).")
@click.option("--id", "backend_id", default=None, help="Backend id (default: derived from the URL).")
@click.option(
    "--tokenizer",
    default=None,
    help="Tokenizer dir the rollout workers can read (default: the model path vLLM reports).",
)
@click.option(
    "--wait-timeout",
    type=float,
    default=1800.0,
    show_default=True,
    help="Seconds to wait for the server's /health before registering.",
)
@click.option(
    "--gateway",
    "gateway_listen",
    default=None,
    metavar="HOST:PORT",
    help="Serve the backend through a node gateway listening here (keys: ROLLOUTS_BACKEND_TOKEN and "
    "ROLLOUTS_BACKEND_ADMIN_TOKEN) and register the gateway, not the server (docs/SECURITY.md).",
)
@click.option(
    "--advertise-url",
    default=None,
    help="With --gateway: the URL others reach the gateway by (default: http://<hostname>:<port>).",
)
@api_options
def register(
    backend_url: str,
    model: str,
    backend_id: str | None,
    tokenizer: str | None,
    wait_timeout: float,
    gateway_listen: str | None,
    advertise_url: str | None,
    api_url: str | None,
    token: str | None,
    capacity: float,
    labels: tuple[str, ...],
) -> None:
    """Register a vLLM server with the pool, heartbeat until SIGTERM/SIGINT, then deregister."""
    settings = get_settings()
    _wait_healthy(backend_url, wait_timeout)
    gateway = _start_gateway(gateway_listen, backend_url, settings) if gateway_listen else None
    registered_url = backend_url
    if gateway is not None:
        registered_url = advertise_url or f"http://{advertised_host(gateway.host)}:{gateway.port}"
        click.echo(f"gateway on {gateway.host}:{gateway.port} in front of {backend_url}", err=True)
    body = {"url": registered_url, "model": model, "capacity": capacity, "labels": _labels(labels)}
    if backend_id:
        body["backend_id"] = backend_id
    if tokenizer:
        body["tokenizer"] = tokenizer
    registration = Registration(connect_admin(api_url, settings, token), body, settings.llm_heartbeat_interval_s)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: registration.stopped.set())
    try:
        backend_id = registration.register_until_done()
        if backend_id is not None:
            click.echo(f"registered {backend_id} ({registered_url}, {model})", err=True)
            registration.run()
    except RegistrationRefused as exc:  # a 4xx: said as click says a usage problem, no traceback
        raise click.ClickException(str(exc)) from None
    finally:
        if (removed := registration.stop()) is not None:  # said as registration is: `rollouts up` logs both
            click.echo(f"deregistered {removed} ({registered_url})", err=True)
        registration.client.close()
        if gateway is not None:  # after deregistering: the pool no longer sends it anything new
            gateway.stop()


def _start_gateway(listen: str, upstream: str, settings: Settings) -> ThreadServer:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise click.BadParameter(f"{listen!r} is not HOST:PORT", param_hint="--gateway")
    try:
        config = GatewayConfig.from_settings(upstream, settings)
        return gateway_server(config, host.strip("[]"), int(port)).start()
    except (ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
