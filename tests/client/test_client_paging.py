"""The client's paging and stream retries against a scripted transport (no server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from rollouts_client import ApiError, AsyncRolloutClient, RetryPolicy, RolloutClient
from rollouts_client.wire import RESULTS_PAGE_GROUPS

NO_WAIT = RetryPolicy(retries=2, first_delay_s=0.0, max_delay_s=0.0)


def group(k: int) -> dict:
    return {"batch_id": "b", "group_id": f"b.b.{k}", "prompt_index": k, "samples": []}


def page_handler(seen: list[httpx.URL]) -> Callable[[httpx.Request], httpx.Response]:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        batch = {"id": "b", "status": "completed", "mode": "all", "target": 1, "n_samples": 2, "pool_size": 1}
        body = {"batch": {**batch, "created_at": 0.0}, "groups": [group(0)], "cursor": "1-0", "done": True}
        return httpx.Response(200, json=body)

    return handle


def test_iter_groups_asks_for_small_pages_when_results_are_embedded() -> None:
    seen: list[httpx.URL] = []
    with RolloutClient("http://api", msgpack=False, transport=httpx.MockTransport(page_handler(seen))) as client:
        assert [g.prompt_index for g in client.iter_groups("b", results=True)] == [0]
        list(client.iter_groups("b", results=False))
    assert seen[0].params["limit"] == str(RESULTS_PAGE_GROUPS) and seen[0].params["results"] == "true"
    assert "limit" not in seen[1].params


def test_async_iter_groups_asks_for_small_pages_too() -> None:
    seen: list[httpx.URL] = []

    async def run() -> None:
        transport = httpx.MockTransport(page_handler(seen))
        async with AsyncRolloutClient("http://api", msgpack=False, transport=transport) as client:
            assert [g.prompt_index async for g in client.iter_groups("b", results=True)] == [0]

    asyncio.run(run())
    assert seen[0].params["limit"] == str(RESULTS_PAGE_GROUPS)


def sse(*events: tuple[str, str, dict]) -> bytes:
    return "".join(f"event: {e}\nid: {i}\ndata: {json.dumps(d)}\n\n" for e, i, d in events).encode()


def stream_script() -> tuple[list[object], list[str]]:
    """Two failures before a good connection, then (with the retries spent once already) two more:
    only a backoff that restarts after a good connection gets through; the second one is a 503."""
    script: list[object] = [
        httpx.ConnectError("down"),
        httpx.ConnectError("down"),
        httpx.Response(200, content=sse(("group", "1-0", group(0)))),  # then the connection drops
        httpx.ConnectError("down"),
        httpx.Response(503, json={"detail": "redis unavailable"}),
        httpx.Response(200, content=sse(("group", "2-0", group(1)), ("end", "3-0", {"status": "completed"}))),
    ]
    last_ids: list[str] = []
    return script, last_ids


def scripted(script: list[object], last_ids: list[str]) -> Callable[[httpx.Request], httpx.Response]:
    def handle(request: httpx.Request) -> httpx.Response:
        last_ids.append(request.headers.get("Last-Event-ID", ""))
        step = script.pop(0)
        if isinstance(step, Exception):
            raise step
        assert isinstance(step, httpx.Response)
        return step

    return handle


def test_iter_events_retries_a_503_and_restarts_its_backoff_after_a_good_connection() -> None:
    script, last_ids = stream_script()
    transport = httpx.MockTransport(scripted(script, last_ids))
    with RolloutClient("http://api", msgpack=False, retry=NO_WAIT, transport=transport) as client:
        assert [g.prompt_index for g in client.iter_events("b")] == [0, 1]
    assert last_ids[-1] == "1-0" and not script


def test_async_iter_events_retries_a_503_and_restarts_its_backoff() -> None:
    script, last_ids = stream_script()

    async def run() -> list[int]:
        transport = httpx.MockTransport(scripted(script, last_ids))
        async with AsyncRolloutClient("http://api", msgpack=False, retry=NO_WAIT, transport=transport) as client:
            return [g.prompt_index async for g in client.iter_events("b")]

    assert asyncio.run(run()) == [0, 1] and not script


def test_iter_events_gives_up_with_the_api_error_when_503s_persist() -> None:
    script: list[object] = [httpx.Response(503, json={"detail": "unavailable"}) for _ in range(3)]
    transport = httpx.MockTransport(scripted(script, []))
    with (
        RolloutClient("http://api", msgpack=False, retry=NO_WAIT, transport=transport) as client,
        pytest.raises(ApiError),
    ):
        list(client.iter_events("b"))


class Dropping(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that sends its events, then fails as a cut connection does (or ends, `drop=False`);
    records whether the client closed it."""

    def __init__(self, body: bytes, drop: bool = True) -> None:
        self.body, self.drop, self.closed = body, drop, False

    def __iter__(self):
        yield self.body
        if self.drop:
            raise httpx.ReadError("connection reset")

    async def __aiter__(self):
        yield self.body
        if self.drop:
            raise httpx.ReadError("connection reset")

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def dropping_script() -> tuple[list[Dropping], Callable[[httpx.Request], httpx.Response]]:
    bodies = [
        Dropping(sse(("group", "1-0", group(0)))),
        Dropping(sse(("group", "2-0", group(1)), ("end", "3-0", {"status": "completed"})), drop=False),
    ]
    script = list(bodies)
    last_ids: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        last_ids.append(request.headers["Last-Event-ID"])
        return httpx.Response(200, stream=script.pop(0))

    handle.last_ids = last_ids  # type: ignore[attr-defined]
    return bodies, handle


def test_iter_events_resumes_after_a_connection_cut_mid_stream_sync_and_async() -> None:
    bodies, handle = dropping_script()
    transport = httpx.MockTransport(handle)
    with RolloutClient("http://api", msgpack=False, retry=NO_WAIT, transport=transport) as client:
        assert [g.prompt_index for g in client.iter_events("b")] == [0, 1]
    assert handle.last_ids == ["0-0", "1-0"] and all(b.closed for b in bodies)  # type: ignore[attr-defined]

    bodies, handle = dropping_script()

    async def run() -> list[int]:
        transport = httpx.MockTransport(handle)
        async with AsyncRolloutClient("http://api", msgpack=False, retry=NO_WAIT, transport=transport) as client:
            return [g.prompt_index async for g in client.iter_events("b")]

    assert asyncio.run(run()) == [0, 1]
    assert handle.last_ids == ["0-0", "1-0"] and all(b.closed for b in bodies)  # type: ignore[attr-defined]


def test_iter_events_gives_up_with_the_transport_error_when_it_cannot_reconnect_sync_and_async() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with (
        RolloutClient("http://api", msgpack=False, retry=NO_WAIT, transport=httpx.MockTransport(handle)) as client,
        pytest.raises(httpx.ConnectError),
    ):
        list(client.iter_events("b"))

    async def run() -> None:
        transport = httpx.MockTransport(handle)
        async with AsyncRolloutClient("http://api", msgpack=False, retry=NO_WAIT, transport=transport) as client:
            [g async for g in client.iter_events("b")]

    with pytest.raises(httpx.ConnectError):
        asyncio.run(run())


def test_leaving_iter_events_early_closes_its_stream() -> None:
    body = Dropping(sse(("group", "1-0", group(0)), ("group", "2-0", group(1))), drop=False)
    transport = httpx.MockTransport(lambda request: httpx.Response(200, stream=body))
    with RolloutClient("http://api", msgpack=False, transport=transport) as client:
        events = client.iter_events("b")
        assert next(events).prompt_index == 0
        assert not body.closed
        events.close()  # what a `break` out of the loop does
    assert body.closed
