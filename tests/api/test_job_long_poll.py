"""`GET /v1/jobs?ids=...&wait_s=...`: a waiting client hears of a job's end when it happens (real redis-server)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fastapi.testclient import TestClient

from api.jobs.long_poll import JobEndWaits
from shared.config import Settings
from shared.jobs.status import JobStatus
from shared.jobs.store import JobStore
from shared.keys import Keys

DEMO = {"task": {"kind": "demo", "text": "abc"}}
LONG = 60  # the longest wait the API takes: an answer well before it came from the job's end


@pytest.fixture()
def client(make_client, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    # Without the subscription a wait re-reads Redis every FALLBACK_S: made as long as the wait here, an
    # answer before LONG can only be the pushed end
    monkeypatch.setattr("api.jobs.long_poll.FALLBACK_S", LONG)
    return make_client()


def submit(client: TestClient, n: int = 1) -> list[str]:
    return client.post("/v1/jobs", json=[DEMO] * n).json()["job_ids"]


def end_soon(settings: Settings, redis, job_id: str, status: JobStatus) -> threading.Thread:
    """Move the job as a worker would, once the poll is waiting (its registration is what is tested)."""

    def move() -> None:
        time.sleep(0.5)
        JobStore(redis, settings, Keys()).transition(job_id, "*", status)

    thread = threading.Thread(target=move)
    thread.start()
    return thread


@pytest.mark.parametrize("status", [JobStatus.DONE, JobStatus.FAILED, JobStatus.TIMED_OUT])
def test_a_waiting_poll_answers_when_one_of_its_jobs_ends(client, redis, settings, status) -> None:
    running, ending = submit(client, 2)
    mover = end_soon(settings, redis, ending, status)
    started = time.monotonic()
    answer = client.get("/v1/jobs", params={"ids": f"{running},{ending}", "wait_s": LONG})
    waited = time.monotonic() - started
    mover.join()
    assert answer.status_code == 200
    statuses = {job["id"]: job["status"] for job in answer.json()["jobs"]}
    assert statuses == {running: "queued", ending: status.value}
    assert waited < LONG, "answered by its wait running out, not by the job's end"


def test_a_cancel_wakes_a_waiting_poll_too(client, redis, settings) -> None:
    (job_id,) = submit(client)
    canceller = threading.Timer(0.5, lambda: JobStore(redis, settings, Keys()).cancel(job_id))
    canceller.start()
    started = time.monotonic()
    answer = client.get("/v1/jobs", params={"ids": job_id, "wait_s": LONG})
    canceller.join()
    assert [job["status"] for job in answer.json()["jobs"]] == ["cancelled"]
    assert time.monotonic() - started < LONG


def test_an_ended_or_missing_job_answers_at_once_and_a_quiet_one_at_the_end_of_its_wait(client, redis, settings):
    queued, ended = submit(client, 2)
    JobStore(redis, settings, Keys()).transition(ended, "*", JobStatus.DONE)
    assert [j["status"] for j in client.get("/v1/jobs", params={"ids": ended, "wait_s": LONG}).json()["jobs"]] == [
        "done"
    ]
    assert client.get("/v1/jobs", params={"ids": f"{queued},{'0' * 32}", "wait_s": LONG}).json()["jobs"][0]["id"] == (
        queued
    )
    quiet = client.get("/v1/jobs", params={"ids": queued, "wait_s": 0.3}).json()["jobs"]
    assert [job["status"] for job in quiet] == ["queued"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"wait_s": 5}, "query.wait_s"),  # a long poll waits for given jobs
        ({"ids": "a", "wait_s": LONG + 1}, "query.wait_s"),
        ({"ids": "a", "wait_s": -1}, "query.wait_s"),
        ({"ids": "a", "wait_s": "soon"}, "query.wait_s"),
        ({"ids": ",", "wait_s": 5}, "query.ids"),  # no job to wait for
    ],
)
def test_a_wrong_wait_is_a_422_naming_it(client, params, field) -> None:
    answer = client.get("/v1/jobs", params=params)
    assert answer.status_code == 422
    assert field in [error["field"] for error in answer.json()["errors"]]


def test_losing_the_subscription_wakes_every_wait_so_it_reads_redis_again() -> None:
    async def scenario() -> list[bool]:
        waits = JobEndWaits()
        waits.on_live(True)
        with waits.watching(["a"]) as first, waits.watching(["b"]) as second:
            waits.on_event("a", "running")  # not an end
            woke_early = first.is_set()
            waits.on_event("a", "done")
            only_first = first.is_set() and not second.is_set()
            waits.on_live(False)
            await waits.wait(second, LONG)  # already set: returns at once
            return [woke_early, only_first, second.is_set()]

    assert asyncio.run(scenario()) == [False, True, True]
