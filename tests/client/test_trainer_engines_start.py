"""TrainerEngines.start: a server the pool refuses leaves nothing registered behind (scripted transport)."""

from __future__ import annotations

import httpx
import pytest

from rollouts_client import ApiError, RolloutClient
from rollouts_client.trainers.engines import TrainerEngines


def test_a_refused_server_takes_the_ones_registered_before_it_out_again() -> None:
    seen: list[tuple[str, str]] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        if request.method == "POST" and b"node2" in request.content:
            return httpx.Response(422, json={"detail": "no", "errors": [{"field": "body.url", "message": "down"}]})
        if request.method == "POST":
            return httpx.Response(201, json={"id": "node1-8000", "url": "http://node1:8000", "model": "m"})
        return httpx.Response(204)

    engines = TrainerEngines(["node1:8000", "node2:8000"], "m", trainer="verl", run_id="r1", api_url="http://api")
    engines.client.close()
    engines.client = RolloutClient("http://api", transport=httpx.MockTransport(api))
    with pytest.raises(ApiError):
        engines.start()
    assert seen == [("POST", "/v1/backends"), ("POST", "/v1/backends"), ("DELETE", "/v1/backends/node1-8000")]
    assert engines.backend_ids == [] and engines.client.http.is_closed
