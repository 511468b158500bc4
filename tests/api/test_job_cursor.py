"""Cursor pages over job lists: every job exactly once, however many are submitted while a reader pages."""

from __future__ import annotations

import itertools

import httpx
import pytest

from rollouts_client import RolloutClient
from shared.keys import Keys

DEMO = {"task": {"kind": "demo", "text": "a"}}


@pytest.fixture()
def client(make_client):
    return make_client()


def pages(client, **params) -> list[list[str]]:
    found, cursor = [], None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        body = client.get("/v1/jobs", params=query).json()
        found.append([job["id"] for job in body["jobs"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return found


def test_cursor_pages_see_every_job_once_while_new_jobs_arrive(client):
    first = client.post("/v1/jobs", json=[DEMO] * 25).json()["job_ids"]  # one request: 25 equal timestamps
    older = client.post("/v1/jobs", json=[DEMO] * 5).json()["job_ids"]
    seen: list[str] = []
    cursor = None
    while True:
        body = client.get("/v1/jobs", params={"limit": 7, **({"cursor": cursor} if cursor else {})}).json()
        seen += [job["id"] for job in body["jobs"]]
        client.post("/v1/jobs", json=DEMO)  # a trainer keeps submitting while it pages
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(first + older) and len(seen) == 30


def test_offset_pages_shift_under_new_jobs_which_is_why_cursors_exist(client):
    client.post("/v1/jobs", json=[DEMO] * 10)
    page1 = [j["id"] for j in client.get("/v1/jobs", params={"limit": 5}).json()["jobs"]]
    client.post("/v1/jobs", json=[DEMO] * 3)
    page2 = [j["id"] for j in client.get("/v1/jobs", params={"limit": 5, "offset": 5}).json()["jobs"]]
    assert set(page1) & set(page2)  # the same jobs again: offsets moved under the reader


def test_group_pages_come_in_sample_order(client):
    jobs = [{**DEMO, "group_id": "g", "sample_index": i} for i in range(9)]
    ids = client.post("/v1/jobs", json=jobs).json()["job_ids"]
    assert list(itertools.chain.from_iterable(pages(client, group_id="g", limit=4))) == ids


def test_a_cursor_whose_job_left_the_index_continues_from_its_place(client, redis):
    ids = client.post("/v1/jobs", json=[DEMO] * 6).json()["job_ids"]
    body = client.get("/v1/jobs", params={"limit": 3}).json()
    first = [j["id"] for j in body["jobs"]]
    assert redis.zrem(Keys().jobs_all, first[-1]) == 1  # its record expired and the index was trimmed
    rest = list(itertools.chain.from_iterable(pages(client, limit=3, cursor=body["next_cursor"])))
    assert sorted(first + rest) == sorted(ids)


@pytest.mark.parametrize("cursor", ["nonsense", "1.5_", "inf_abc", "1.5_../x"])
def test_a_cursor_that_is_not_ours_is_a_422_naming_it(client, cursor):
    response = client.get("/v1/jobs", params={"cursor": cursor})
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "query.cursor"


def test_cursor_and_offset_together_are_refused(client):
    response = client.get("/v1/jobs", params={"cursor": "1.0_abc", "offset": 3})
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "query.offset"


def test_the_client_iterates_every_job_by_cursor(client):
    ids = client.post("/v1/jobs", json=[DEMO] * 12).json()["job_ids"]

    def through_the_app(request: httpx.Request) -> httpx.Response:
        answer = client.request(request.method, str(request.url), headers=request.headers, content=request.content)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    with RolloutClient("http://testserver", transport=httpx.MockTransport(through_the_app)) as rollouts:
        assert sorted(job.id for job in rollouts.iter_jobs(page_size=5)) == sorted(ids)
