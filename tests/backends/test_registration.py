"""rollouts_client.registration.Registration against a scripted API: outages never end registration or heartbeats."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from rollouts_client import RetryPolicy, RolloutClient
from rollouts_client.registration import Registration, RegistrationRefused


class ScriptedApi:
    """Answers each request with the next scripted status; calls ``on_done`` once the script is used up."""

    def __init__(self, statuses: list[int | type[Exception]], on_done: Callable[[], None] = lambda: None) -> None:
        self.statuses = list(statuses)
        self.calls: list[tuple[str, str]] = []
        self.on_done = on_done

    def __call__(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path
        self.calls.append((method, path))
        if not self.statuses:
            self.on_done()
            return httpx.Response(200, json={})
        status = self.statuses.pop(0)
        if isinstance(status, type):
            raise status("scripted outage")
        body = {"id": "b-1"} if method == "POST" and path == "/v1/backends" else {}
        return httpx.Response(status, json=body)


def client(handler: Callable[[httpx.Request], httpx.Response]) -> RolloutClient:
    """The CLI's real client over a scripted transport; no retries of its own, so Registration's show."""
    return RolloutClient("http://api", transport=httpx.MockTransport(handler), retry=RetryPolicy(retries=0))


def registration(statuses: list[int | type[Exception]]) -> tuple[Registration, ScriptedApi]:
    api = ScriptedApi(statuses)
    reg = Registration(client(api), {"url": "http://b:8000", "model": "m"}, interval_s=0.001)
    api.on_done = reg.stopped.set
    return reg, api


def test_a_failed_re_registration_does_not_end_the_heartbeats() -> None:
    # forgotten (404), then the re-registration hits a 500, an outage, a 503; then it comes back
    reg, api = registration([404, 500, 404, 500, 404, httpx.ConnectError, 404, 201, 200])
    reg.backend_id = "b-1"
    reg.run()  # used to die with ClickException at the first refused re-registration
    posts = [c for c in api.calls if c == ("POST", "/v1/backends")]
    assert len(posts) == 4 and reg.backend_id == "b-1"
    assert api.calls[-2] == ("POST", "/v1/backends/b-1/heartbeat"), "heartbeats went on after re-registering"


def test_initial_registration_rides_out_outages_but_not_a_4xx() -> None:
    reg, api = registration([503, httpx.ConnectError, 500, 201])
    reg.stopped.clear()
    api.on_done = lambda: None
    assert reg.register_until_done() == "b-1" and len(api.calls) == 4
    reg, _ = registration([500, 401])
    with pytest.raises(RegistrationRefused):
        reg.register_until_done()


def test_backoff_grows_and_is_capped() -> None:
    reg = Registration(None, {}, interval_s=2.0)  # type: ignore[arg-type]
    assert [reg._backoff(n) for n in (1, 2, 3, 10)] == [4.0, 8.0, 16.0, 30.0]
    assert Registration(None, {}, interval_s=60.0)._backoff(5) == 60.0  # type: ignore[arg-type]


def test_a_registration_that_lands_after_stop_is_withdrawn() -> None:
    calls: list[tuple[str, str]] = []

    def register_then_stop(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path))
        if request.url.path == "/v1/backends":
            reg.stopped.set()  # SIGTERM while the POST is in flight
            return httpx.Response(201, json={"id": "b-1"})
        return httpx.Response(204)

    reg = Registration(client(register_then_stop), {"url": "http://b:8000", "model": "m"}, interval_s=0.001)
    assert reg.register_until_done() is None
    assert calls == [("POST", "/v1/backends"), ("DELETE", "/v1/backends/b-1")]
