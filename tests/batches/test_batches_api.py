"""The batches API in-process against a real redis-server; jobs are finished by hand in a thread,
so long-poll and SSE are exercised while groups really arrive."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import msgpack
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from shared.batches.replenish import batch_store
from shared.batches.store import BatchStore
from shared.config import Settings
from tests.batches.driving import finish_group

INFORMATIVE = {"kind": "dapo_sim", "rewards": [0.0, 1.0]}
UNIFORM = {"kind": "dapo_sim", "rewards": [1.0]}


@pytest.fixture()
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings.model_copy(update={"task_modules": ["bench.dapo_kind"]}))) as test_client:
        yield test_client


@pytest.fixture()
def batches(client: TestClient) -> BatchStore:
    return batch_store(client.app.state.store)


def create(client: TestClient, **body: object) -> dict:
    response = client.post("/v1/batches", json={"n_samples": 2, **body})
    assert response.status_code == 202, response.text
    return response.json()


def drive(batches: BatchStore, batch_id: str, delay: float = 0.05) -> threading.Thread:
    """Finish in-flight groups one by one, oldest first, until the batch closes."""

    def run() -> None:
        while batches.head(batch_id)["status"] == "running":
            groups = batches.in_flight_groups(batch_id)
            if groups:
                finish_group(batches, batch_id, groups[0])
            time.sleep(delay)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_invalid_batches_are_refused_naming_the_field(client, tmp_path):
    cases = [
        ({"prompts": [INFORMATIVE], "n_samples": 0}, "body.n_samples"),
        ({"prompts": [INFORMATIVE], "prompts_path": "/x.jsonl"}, "body"),
        ({"prompts": [INFORMATIVE, {"kind": "nope"}]}, "body.prompts[1].task.kind"),
        ({"prompts": [INFORMATIVE, {"kind": "dapo_sim", "rewards": []}]}, "body.prompts[1].task.rewards"),
        ({"prompts": [{"task": INFORMATIVE, "limits": {"max_turns": 0}}]}, "body.prompts[0].limits.max_turns"),
        ({"prompts": [{"task": INFORMATIVE, "group_id": "g"}]}, "body.prompts[0].group_id"),  # the batch's to set
        ({"prompts_path": "relative.jsonl"}, "body.prompts_path"),
        ({"prompts_path": str(tmp_path / "missing.jsonl")}, "body.prompts_path"),
        ({"prompts": [INFORMATIVE], "on_target": "drop"}, "body.on_target"),
        ({"prompts": [INFORMATIVE], "min_informative_groups": 2}, "body.min_informative_groups"),
    ]
    for body, field in cases:
        response = client.post("/v1/batches", json=body)
        assert response.status_code == 422, (body, response.text)
        assert field in [e["field"] for e in response.json()["errors"]], response.json()
    bad_line = tmp_path / "pool.jsonl"
    bad_line.write_text(json.dumps(INFORMATIVE) + "\n{oops\n")
    response = client.post("/v1/batches", json={"prompts_path": str(bad_line)})
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "body.prompts_path:2"
    bad_task = tmp_path / "tasks.jsonl"
    bad_task.write_text(json.dumps(INFORMATIVE) + "\n" + json.dumps({"kind": "nope"}) + "\n")
    response = client.post("/v1/batches", json={"prompts_path": str(bad_task)})
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == "body.prompts_path:2.task.kind"
    assert client.post("/v1/batches", content=b"{").status_code == 400
    assert client.get("/v1/batches/nope").status_code == 404


def test_a_pool_file_on_the_server_with_job_shaped_lines(client, batches, tmp_path):
    path = tmp_path / "pool.jsonl"
    lines = [{"task": INFORMATIVE, "metadata": {"row": i}, "limits": {"max_turns": 3}} for i in range(3)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    batch = create(client, prompts_path=str(path), max_groups_in_flight=3)
    assert batch["pool_size"] == 3 and batch["counts"]["launched"] == 3 and batch["mode"] == "all"
    job_id = batches.group_job_ids(batch["id"], 1)[0]
    spec = client.get(f"/v1/jobs/{job_id}").json()["request"]
    assert spec["limits"]["max_turns"] == 3
    assert spec["metadata"] == {"row": 1, "batch_id": batch["id"], "prompt_index": 1}
    assert spec["group_id"] == f"b.{batch['id']}.1"


def test_long_poll_delivers_every_used_group_once_with_grpo_statistics(client, batches):
    prompts = [UNIFORM, INFORMATIVE] * 8
    batch = create(client, prompts=prompts, min_informative_groups=5, max_groups_in_flight=3)
    thread = drive(batches, batch["id"])
    seen: list[int] = []
    cursor = "0-0"
    for _ in range(200):
        page = client.get(f"/v1/batches/{batch['id']}/groups", params={"after": cursor, "wait": 5}).json()
        for group in page["groups"]:
            assert group["outcome"] == "informative" and group["used"]
            assert group["rewards"] == [0.0, 1.0] and group["mean"] == 0.5 and group["std"] == 0.5
            assert group["advantages"] == pytest.approx([-1.0, 1.0], abs=1e-4)
            assert group["prompt"]["task"] == INFORMATIVE
            seen.append(group["prompt_index"])
        cursor = page["cursor"]
        if page["done"]:
            break
    thread.join(timeout=10)
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 5
    final = client.get(f"/v1/batches/{batch['id']}").json()
    assert final["status"] == "completed" and final["counts"]["used"] == 5
    assert final["counts"]["filtered"] == final["counts"]["launched"] - 5 - final["counts"]["late"]
    # a cursor past the end answers at once, done, with nothing new
    again = client.get(f"/v1/batches/{batch['id']}/groups", params={"after": cursor, "wait": 30})
    assert again.status_code == 200, again.text
    assert again.json()["done"] and again.json()["groups"] == []


def test_long_poll_returns_after_the_wait_when_nothing_completes(client):
    batch = create(client, prompts=[INFORMATIVE])
    page = client.get(f"/v1/batches/{batch['id']}/groups", params={"wait": 0.5}).json()
    assert page["groups"] == [] and not page["done"]


def test_groups_in_flight_default_to_a_setting_and_are_capped(settings: Settings) -> None:
    """A big pool without max_groups_in_flight must not reserve (and submit) every group at once."""
    caps = {"batch_default_groups_in_flight": 3, "batch_max_groups_in_flight": 5}
    limited = settings.model_copy(update={"task_modules": ["bench.dapo_kind"], **caps})
    with TestClient(create_app(limited)) as limited_client:
        default = create(limited_client, prompts=[INFORMATIVE] * 20)
        assert default["max_groups_in_flight"] == 3 and default["counts"]["launched"] == 3
        small = create(limited_client, prompts=[INFORMATIVE] * 2)
        assert small["max_groups_in_flight"] == 2 and small["counts"]["launched"] == 2
        asked = create(limited_client, prompts=[INFORMATIVE] * 20, max_groups_in_flight=1000)
        assert asked["max_groups_in_flight"] == 5 and asked["counts"]["launched"] == 5


def test_sse_streams_every_group_once_then_end_and_resumes_from_last_event_id(client, batches):
    batch = create(client, prompts=[INFORMATIVE, UNIFORM] * 5, min_informative_groups=4, max_groups_in_flight=2)
    thread = drive(batches, batch["id"])
    events = read_sse(client, f"/v1/batches/{batch['id']}/events")
    thread.join(timeout=10)
    groups = [data for event, _, data in events if event == "group"]
    assert [event for event, _, _ in events][-1] == "end"
    assert len(groups) == 4 and len({g["prompt_index"] for g in groups}) == 4
    assert events[-1][2]["status"] == "completed"
    # reconnecting after the second group replays only what came after it
    second_id = events[1][1]
    replay = read_sse(client, f"/v1/batches/{batch['id']}/events", headers={"Last-Event-ID": second_id})
    assert [d["prompt_index"] for e, _, d in replay if e == "group"] == [g["prompt_index"] for g in groups[2:]]


def read_sse(client: TestClient, url: str, headers: dict | None = None) -> list[tuple[str, str, dict]]:
    events: list[tuple[str, str, dict]] = []
    with client.stream("GET", url, headers=headers) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if not line:
                if fields:
                    events.append((fields["event"], fields["id"], json.loads(fields["data"])))
                    if fields["event"] == "end":
                        break
                fields = {}
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
    return events


def test_cancel_stops_launching_cancels_running_jobs_and_ends_streams(client, batches):
    batch = create(client, prompts=[INFORMATIVE] * 6, min_informative_groups=5, max_groups_in_flight=2)
    finish_group(batches, batch["id"], 0)
    response = client.delete(f"/v1/batches/{batch['id']}")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    for k in (1, 2):
        assert set(batches.jobs.statuses(batches.group_job_ids(batch["id"], k))) == {"cancelled"}
    view = client.get(f"/v1/batches/{batch['id']}").json()
    assert view["counts"]["in_flight"] == 0 and view["counts"]["launched"] == 3 and view["counts"]["late"] == 2
    page = client.get(f"/v1/batches/{batch['id']}/groups", params={"wait": 30}).json()
    assert page["done"] and [g["prompt_index"] for g in page["groups"]] == [0]
    assert client.delete(f"/v1/batches/{batch['id']}").status_code == 409
    assert client.delete("/v1/batches/nope").status_code == 404


def test_cancelling_one_job_through_the_jobs_api_fails_its_group_and_replenishes(client, batches):
    batch = create(client, prompts=[INFORMATIVE] * 3, min_informative_groups=1, max_groups_in_flight=1)
    first, _second = batches.group_job_ids(batch["id"], 0)
    assert client.delete(f"/v1/jobs/{first}").status_code == 200
    finish_group(batches, batch["id"], 0)
    group = client.get(f"/v1/batches/{batch['id']}/groups", params={"wait": 0}).json()["groups"][0]
    assert group["outcome"] == "failed" and not group["used"] and "cancelled" in group["error"]
    assert group["rewards"] == [None, 1.0] and group["advantages"] == [None, 0.0]
    assert batches.in_flight_groups(batch["id"]) == [1]


def test_msgpack_and_embedded_results(client, batches):
    batch = create(client, prompts=[INFORMATIVE], min_informative_groups=1)
    for job_id in batches.group_job_ids(batch["id"], 0):
        record = batches.jobs.get(job_id)
        trajectory = {"token_ids": [1, 2], "sample": record["sample_index"]}
        batches.jobs.set_fields(job_id, batches.jobs.store_part(job_id, "rollout", trajectory))
    finish_group(batches, batch["id"], 0)
    response = client.get(
        f"/v1/batches/{batch['id']}/groups",
        params={"results": "true", "wait": 0},
        headers={"Accept": "application/msgpack"},
    )
    assert response.headers["content-type"] == "application/msgpack"
    page = msgpack.unpackb(response.content)
    samples = page["groups"][0]["samples"]
    assert [s["result"]["trajectory"]["sample"] for s in samples] == [0, 1]
    assert [s["result"]["reward"] for s in samples] == [0.0, 1.0]


def test_a_sample_whose_stored_result_is_gone_says_so_and_the_page_still_comes(client, batches):
    batch = create(client, prompts=[INFORMATIVE], min_informative_groups=1)
    first, second = batches.group_job_ids(batch["id"], 0)
    for job_id in (first, second):
        batches.jobs.set_fields(job_id, batches.jobs.store_part(job_id, "rollout", {"token_ids": [1, 2]}))
    finish_group(batches, batch["id"], 0)
    lost = batches.jobs.results.path(first, "rollout", batches.jobs.get(first)["refs"]["rollout"])
    lost.unlink()

    page = client.get(f"/v1/batches/{batch['id']}/groups", params={"results": "true", "wait": 0})

    assert page.status_code == 200
    lost_sample, kept_sample = page.json()["groups"][0]["samples"]
    assert lost_sample["result"] is None and first in lost_sample["result_error"]
    assert str(lost) in lost_sample["result_error"]
    assert kept_sample["result"]["trajectory"] == {"token_ids": [1, 2]} and "result_error" not in kept_sample
    assert client.get(f"/v1/jobs/{first}").status_code == 410


def test_a_job_submitted_outside_the_batch_with_its_group_id_does_not_count(client, batches):
    batch = create(client, prompts=[INFORMATIVE] * 2, min_informative_groups=1, max_groups_in_flight=1)
    rogue = {"task": INFORMATIVE, "group_id": f"b.{batch['id']}.0", "sample_index": 1}
    refused = client.post("/v1/jobs", json=rogue)  # the API reserves batch group ids ...
    assert refused.status_code == 422 and "body.group_id" in refused.json()["detail"]
    rogue_id = batches.jobs.submit([{**rogue, "limits": {}, "sampling": {}}])[0].job_id  # ... the hook ignores them too
    assert client.delete(f"/v1/jobs/{rogue_id}").status_code == 200
    assert batches.group(batch["id"], 0)["recorded"] == 0
    finish_group(batches, batch["id"], 0)
    assert client.get(f"/v1/batches/{batch['id']}").json()["counts"]["used"] == 1


def test_a_prompts_path_must_be_a_small_regular_file(settings: Settings, tmp_path) -> None:
    """/dev/zero would exhaust memory, a FIFO would block a thread forever, a huge file is refused."""
    import os

    fifo = tmp_path / "pool.fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps(INFORMATIVE) + "\n" + " " * 4096 + "\n")
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps(INFORMATIVE) + "\n")
    capped = settings.model_copy(update={"task_modules": ["bench.dapo_kind"], "prompt_file_max_bytes": 1024})
    with TestClient(create_app(capped)) as limited:
        for path, message in [("/dev/zero", "not a regular file"), (fifo, "not a regular file"), (big, "limit")]:
            response = limited.post("/v1/batches", json={"prompts_path": str(path), "n_samples": 2})
            assert response.status_code == 422, response.text
            [error] = response.json()["errors"]
            assert error["field"] == "body.prompts_path" and message in error["message"], error
        assert create(limited, prompts_path=str(small))["pool_size"] == 1


def test_pages_with_embedded_results_are_capped(client, batches):
    from api.batches.router import MAX_RESULTS_PAGE

    count = MAX_RESULTS_PAGE + 4
    batch = create(client, prompts=[INFORMATIVE] * count, max_groups_in_flight=count)
    for k in range(count):
        finish_group(batches, batch["id"], k)
    url = f"/v1/batches/{batch['id']}/groups"
    with_results = client.get(url, params={"results": "true", "limit": 1000, "wait": 0}).json()
    assert 0 < len(with_results["groups"]) <= MAX_RESULTS_PAGE
    plain = client.get(url, params={"limit": 1000, "wait": 0}).json()
    assert len(plain["groups"]) == count
