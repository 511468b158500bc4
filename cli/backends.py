"""`rollouts register`: what a vLLM launch script runs beside the server.

A vLLM launch script starts the server, then runs `rollouts register --backend-url ...` next
to it: the command waits for the server's /health, registers it with the API, heartbeats
until it gets SIGTERM/SIGINT (Slurm's scancel, Ctrl-C) and then deregisters, so the pool
never routes to a server that was stopped on purpose.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import click
import httpx

from cli.connect import advertised_host, connect_admin
from gateway.app import GatewayConfig
from gateway.server import ThreadedServer
from rollouts_client import ApiError, RolloutClient
from shared.backend_pool.probe import probe_health
from shared.config import Settings, get_settings
from shared.errors import RolloutsError

log = logging.getLogger(__name__)


_MAX_BACKOFF_S = 30.0


class RegistrationRefused(RolloutsError, click.ClickException):
    """The API refused the registration for good (a 4xx: bad token, bad body)."""


class Registration:
    """Keeps one backend registered with the API: register, heartbeat, re-register if forgotten.

    API outages (connection errors, 5xx, a refused re-registration) never end it: it keeps
    trying with exponential backoff (up to 30 s, or the heartbeat interval if longer) until
    ``stop``.
    """

    def __init__(self, client: RolloutClient, body: dict[str, Any], interval_s: float) -> None:
        """`body`: RolloutClient.register_backend's arguments (url, model, backend_id, capacity, ...)."""
        self.client = client
        self.body = body
        self.interval_s = interval_s
        self.backend_id: str | None = None
        self.stopped = threading.Event()

    def register(self) -> str:
        try:
            backend = self.client.register_backend(**self.body)
        except ApiError as exc:
            kind = click.ClickException if exc.status_code >= 500 else RegistrationRefused
            raise kind(f"registration refused ({exc.status_code}): {str(exc.detail)[:500]}") from None
        self.backend_id = backend["id"]
        return self.backend_id

    def register_until_done(self) -> str | None:
        """Register, riding out API outages with backoff; None if stopped first.

        A 4xx (RegistrationRefused) is raised: retrying the same request cannot help.
        """
        failures = 0
        while not self.stopped.is_set():
            try:
                backend_id = self.register()
            except RegistrationRefused:
                raise
            except (httpx.HTTPError, click.ClickException) as exc:
                failures += 1
                delay = self._backoff(failures)
                log.warning("registration failed (%s); retrying in %.1fs", _message(exc), delay)
                self.stopped.wait(delay)
                continue
            if self.stopped.is_set():  # stopped while the request was in flight: do not linger
                self._deregister()
                return None
            return backend_id
        return None

    def beat(self) -> bool:
        """One heartbeat; re-registers if the API forgot the backend. False: the API did not take it."""
        assert self.backend_id is not None
        try:
            self.client.backend_heartbeat(self.backend_id)
        except ApiError as exc:
            if exc.status_code == 404:  # removed by an operator or a wiped Redis: come back
                log.warning("backend %s was forgotten by the API; registering again", self.backend_id)
                self.register()
                return True
            log.warning("heartbeat answered %s: %s", exc.status_code, str(exc.detail)[:200])
            return False
        return True

    def run(self) -> None:
        """Heartbeat until ``stop``; API outages are logged and ridden out with backoff, never fatal."""
        failures = 0
        while not self.stopped.wait(self._backoff(failures) if failures else self.interval_s):
            try:
                ok = self.beat()
            except (httpx.HTTPError, click.ClickException) as exc:
                log.warning("heartbeat failed: %s", _message(exc))
                ok = False
            failures = 0 if ok else failures + 1

    def _backoff(self, failures: int) -> float:
        return min(self.interval_s * 2 ** min(failures, 16), max(_MAX_BACKOFF_S, self.interval_s))

    def stop(self) -> str | None:
        """Stop beating and deregister; returns the id deregistered (None: none was, or the API was away)."""
        self.stopped.set()
        return self._deregister()

    def _deregister(self) -> str | None:
        backend_id, self.backend_id = self.backend_id, None
        if backend_id is None:
            return None
        try:
            removed = self.client.deregister_backend(backend_id)
            log.info("deregistered %s%s", backend_id, "" if removed else " (the pool had already dropped it)")
        except (httpx.HTTPError, ApiError) as exc:
            log.warning("deregistration failed (the pool will drop it after missed heartbeats): %s", exc)
            return None
        return backend_id


def _message(exc: Exception) -> str:
    return exc.format_message() if isinstance(exc, click.ClickException) else str(exc)


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
    help="Serve the backend through a node gateway listening here (keys: ROLLOUTS_BACKEND_KEY and "
    "ROLLOUTS_BACKEND_ADMIN_KEY) and register the gateway, not the server (docs/SECURITY.md).",
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
    finally:
        if (removed := registration.stop()) is not None:  # said as registration is: `rollouts up` logs both
            click.echo(f"deregistered {removed} ({registered_url})", err=True)
        registration.client.close()
        if gateway is not None:  # after deregistering: the pool no longer sends it anything new
            gateway.stop()


def _start_gateway(listen: str, upstream: str, settings: Settings) -> ThreadedServer:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise click.BadParameter(f"{listen!r} is not HOST:PORT", param_hint="--gateway")
    try:
        config = GatewayConfig.from_settings(upstream, settings)
        return ThreadedServer.gateway(config, host.strip("[]"), int(port)).start()
    except (ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
