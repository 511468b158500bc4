"""The trainer bridges' shared waiter: one long poll for every row's job, cut short when a row joins
(scripted transport: what is tested is which requests it sends and when it resolves whom)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rollouts_client import AsyncRolloutClient, WaitTimeout
from rollouts_client.trainers.waiting import LONG_POLL_S, JobWaiter


def summary(job_id: str, status: str) -> dict[str, object]:
    return {"id": job_id, "status": status, "kind": "demo", "created_at": 0.0, "updated_at": 0.0}


class Service:
    """Long polls that wait for `end(job_id)`, as the API's do; every poll's ids and wait recorded."""

    def __init__(self, push: bool = True) -> None:
        self.push = push
        self.ended: set[str] = set()
        self.changed = asyncio.Event()
        self.polls: list[tuple[list[str], float]] = []

    def end(self, job_id: str) -> None:
        self.ended.add(job_id)
        self.changed.set()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":
            ids = request.url.params["ids"].split(",")
            wait_s = float(request.url.params.get("wait_s", 0))
            self.polls.append((ids, wait_s))
            if self.push and wait_s and not self.ended & set(ids):
                self.changed.clear()
                await asyncio.wait_for(self.changed.wait(), wait_s)
            jobs = [summary(j, "done" if j in self.ended else "running") for j in ids]
            return httpx.Response(200, json={"jobs": jobs, "limit": len(ids), "offset": 0})
        job_id = request.url.path.rsplit("/", 1)[-1]
        status = "done" if job_id in self.ended else "running"
        return httpx.Response(200, json={**summary(job_id, status), "timings": {}, "attempts": {}})


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0.01)


def test_one_long_poll_serves_every_row_and_a_joining_row_is_asked_for_at_once() -> None:
    async def scenario() -> None:
        service = Service()
        waiter = JobWaiter(AsyncRolloutClient("http://api", transport=httpx.MockTransport(service)), 0.01, 0.02)
        first = asyncio.ensure_future(waiter.wait("a"))
        await settle()
        second = asyncio.ensure_future(waiter.wait("b"))
        await settle()
        assert [ids for ids, _ in service.polls] == [["a"], ["a", "b"]], "the join cut the first poll short"
        assert all(wait == LONG_POLL_S for _, wait in service.polls)
        service.end("b")
        assert (await asyncio.wait_for(second, 30)).status == "done"
        assert not first.done()
        service.end("a")
        assert (await asyncio.wait_for(first, 30)).status == "done"
        assert len(service.polls) == 3, "one request per end, none in between"

    asyncio.run(scenario())


def test_a_service_that_answers_at_once_is_polled_at_the_interval_not_spun() -> None:
    async def scenario() -> None:
        service = Service(push=False)
        waiter = JobWaiter(AsyncRolloutClient("http://api", transport=httpx.MockTransport(service)), 0.05, 0.1)
        waited = asyncio.ensure_future(waiter.wait("a"))
        await asyncio.sleep(1.0)
        polls = len(service.polls)
        service.end("a")
        assert (await asyncio.wait_for(waited, 30)).status == "done"
        assert 1 <= polls <= 21, f"{polls} polls in 1 s at a 50-100 ms interval: it spun"

    asyncio.run(scenario())


def test_a_wait_that_times_out_leaves_the_watch() -> None:
    async def scenario() -> None:
        service = Service()
        waiter = JobWaiter(AsyncRolloutClient("http://api", transport=httpx.MockTransport(service)), 0.01, 0.02)
        with pytest.raises(WaitTimeout):
            await waiter.wait("a", timeout=0.2)
        await settle()
        assert waiter.task is not None and waiter.task.done(), "no watch goes on for a job no one waits for"
        assert [ids for ids, _ in service.polls] == [["a"]]

    asyncio.run(scenario())
