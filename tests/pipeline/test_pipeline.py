"""The pipeline end to end: real redis-server, uvicorn API and one worker process per stage."""

from __future__ import annotations

from pathlib import Path

from tests.support.holds import Gate
from tests.support.waiting import TERMINAL, client_for, trace, wait_for, wait_status


def scripted(trace_dir: Path, **task: object) -> dict:
    return {"task": {"kind": "scripted", "trace": str(trace_dir), **task}}


def test_a_job_goes_through_every_stage_and_back(make_stack, trace_dir):
    stack = make_stack()
    api = client_for(stack)
    job_id = api.post("/v1/jobs", json=scripted(trace_dir, reward=0.5)).json()["job_ids"][0]

    record = wait_status(api, job_id)

    assert record["status"] == "done", record
    assert record["lost"] == {}, "rq saw a stage fail and re-ran it"
    stages = api.get("/v1/status").json()["stages"]
    assert all(stages[s]["failed"] == 0 for s in stages), "rq recorded a failed stage run"
    assert record["result"]["reward"] == 0.5
    # state crossed stages through the workspace: rollout read what init wrote
    assert record["result"]["trajectory"]["saw"] == "prepared by init"
    assert record["result"]["trajectory"]["after_init"] == {"prepared": True}
    for stage in ("init", "rollout", "eval"):
        t = record["timings"][stage]
        assert t["queued"] <= t["started"] <= t["ended"], (stage, t)
        assert record["attempts"][stage] == 1
        assert record["workers"][stage].startswith(f"{stage}.")
    assert record["timings"]["init"]["ended"] <= record["timings"]["rollout"]["started"]
    assert record["timings"]["rollout"]["ended"] <= record["timings"]["eval"]["started"]
    assert [line.split()[:2] for line in trace(trace_dir, job_id) if "cleanup" not in line] == [
        ["init", "start"],
        ["init", "end"],
        ["rollout", "start"],
        ["rollout", "end"],
        ["eval", "start"],
        ["eval", "end"],
    ]
    # The job end removes the workspace right after the status moves (a busy machine shows the gap).
    wait_for(lambda: not (stack.settings.workspaces / job_id).exists(), what="the workspace to go with its job")
    # the trajectory and evaluation went to the results store; the embedded Redis is bounded
    service = api.get("/v1/status").json()
    assert service["results"]["files"] == 2 and service["results"]["healthy"]
    assert service["redis"]["limit_bytes"] == stack.settings.redis_maxmemory() and service["redis"]["accepting"]


def test_a_hundred_jobs_submitted_at_once_all_finish(make_stack):
    stack = make_stack()
    api = client_for(stack)
    jobs = [
        {"task": {"kind": "demo", "text": f"job {i}"}, "group_id": f"g{i // 4}", "sample_index": i % 4}
        for i in range(100)
    ]
    response = api.post("/v1/jobs", json=jobs)
    assert response.status_code == 202
    ids = response.json()["job_ids"]
    assert len(set(ids)) == 100

    def all_done() -> list[dict] | None:
        rows = api.get("/v1/jobs", params={"ids": ",".join(ids), "limit": 100}).json()["jobs"]
        return rows if all(r["status"] in TERMINAL for r in rows) else None

    rows = wait_for(all_done, timeout=120, what="100 jobs to finish")
    assert [r["status"] for r in rows].count("done") == 100
    stages = api.get("/v1/status").json()["stages"]
    assert all(stages[s]["failed"] == 0 for s in stages), "rq recorded failed stage runs"
    assert all(api.get(f"/v1/jobs/{i}").json()["lost"] == {} for i in ids[:10])
    assert all(r["reward"] == 1.0 for r in rows)
    group = api.get("/v1/jobs", params={"group_id": "g3"}).json()["jobs"]
    assert [r["sample_index"] for r in group] == [0, 1, 2, 3]
    assert api.get("/v1/status").json()["jobs"]["done"] == 100


def test_a_stage_that_raises_fails_its_job_and_the_others_go_on(make_stack, trace_dir):
    stack = make_stack()
    api = client_for(stack)
    bad = api.post("/v1/jobs", json=scripted(trace_dir, fail="rollout")).json()["job_ids"][0]
    good = api.post("/v1/jobs", json=[scripted(trace_dir) for _ in range(5)]).json()["job_ids"]

    failed = wait_status(api, bad)
    assert failed["status"] == "failed"
    assert failed["error"]["stage"] == "rollout"
    assert failed["error"]["type"] == "RuntimeError"
    assert "scripted failure in rollout" in failed["error"]["message"]
    assert "Traceback" in failed["error"]["traceback"] and "kinds.py" in failed["error"]["traceback"]
    assert failed["partial"] == {"progress": "rollout started"}
    assert "eval" not in failed["timings"]
    # The job end removes the workspace right after the status moves (a busy machine shows the gap).
    wait_for(lambda: not (stack.settings.workspaces / bad).exists(), what="the failed job's workspace to go")
    for job_id in good:
        assert wait_status(api, job_id)["status"] == "done"


def test_a_job_cancelled_while_queued_never_runs(make_stack, trace_dir):
    stack = make_stack(concurrency={"init": 1, "rollout": 1, "eval": 1})
    api = client_for(stack)
    blocker = api.post("/v1/jobs", json=scripted(trace_dir, sleep={"init": 60})).json()["job_ids"][0]
    wait_for(lambda: trace(trace_dir, blocker), what="the blocker to occupy the only init slot")
    target = api.post("/v1/jobs", json=scripted(trace_dir)).json()["job_ids"][0]

    response = api.delete(f"/v1/jobs/{target}")
    assert response.status_code == 200
    assert response.json() == {"id": target, "status": "cancelled", "previous": "queued"}
    api.delete(f"/v1/jobs/{blocker}")  # frees the slot; the worker then dequeues the target

    wait_for(lambda: api.get("/v1/status").json()["stages"]["init"]["queued"] == 0, what="the init queue to drain")
    wait_for(lambda: api.get("/v1/status").json()["stages"]["init"]["running"] == 0, what="init to go idle")
    assert trace(trace_dir, target) == []
    record = api.get(f"/v1/jobs/{target}").json()
    assert record["status"] == "cancelled" and "started" not in record["timings"].get("init", {})
    assert api.delete(f"/v1/jobs/{target}").status_code == 409


def test_a_running_job_is_stopped_by_cancel_and_its_state_cleaned_up(make_stack, trace_dir):
    stack = make_stack()
    api = client_for(stack)
    job_id = api.post("/v1/jobs", json=scripted(trace_dir, sleep={"rollout": 120})).json()["job_ids"][0]
    wait_for(
        lambda: any(line.startswith("rollout start") for line in trace(trace_dir, job_id)), what="rollout to start"
    )
    assert (stack.settings.workspaces / job_id).exists()

    assert api.delete(f"/v1/jobs/{job_id}").json()["previous"] == "rollout"

    record = wait_for(
        lambda: (r := api.get(f"/v1/jobs/{job_id}").json())["timings"]["rollout"].get("ended") and r,
        what="the rollout worker to stop the job",
    )
    assert record["status"] == "cancelled"
    assert record["partial"] == {"progress": "rollout started"}
    assert any(line.startswith("rollout cleanup") for line in trace(trace_dir, job_id)), "per-stage cleanup did not run"
    assert not any(line.startswith("rollout end") for line in trace(trace_dir, job_id))
    wait_for(lambda: not (stack.settings.workspaces / job_id).exists(), what="the cancelled job's workspace to go")
    assert api.get("/v1/status").json()["stages"]["eval"]["queued"] == 0


def test_a_stage_over_its_time_limit_ends_timed_out_with_what_it_had(make_stack, trace_dir):
    stack = make_stack()
    api = client_for(stack)
    job = scripted(trace_dir, sleep={"rollout": 120})
    job["limits"] = {"rollout_timeout_s": 1.5}
    job_id = api.post("/v1/jobs", json=job).json()["job_ids"][0]

    record = wait_status(api, job_id)

    assert record["status"] == "timed_out"
    assert record["error"]["type"] == "timeout" and record["error"]["stage"] == "rollout"
    assert "rollout stage time limit" in record["error"]["message"]
    assert record["partial"] == {"progress": "rollout started"}
    t = record["timings"]["rollout"]
    assert t["ended"] - t["started"] >= 1.5
    wait_for(lambda: not (stack.settings.workspaces / job_id).exists(), what="the timed-out job's workspace to go")


def test_the_total_time_limit_spans_stages(make_stack, trace_dir, tmp_path):
    """The job's total limit counts from its submission, across stages: a rollout held (never
    released) ends at the total deadline, far before its own stage limit would end it. Init only
    has to start and end within the total's margin, which is wide (seconds, not a race)."""
    stack = make_stack()
    api = client_for(stack)
    total_s, rollout_s = 8.0, 600.0
    job = scripted(trace_dir, sleep={"init": 1.0}, **Gate(tmp_path / "never").hold("rollout"))
    job["limits"] = {"total_timeout_s": total_s, "rollout_timeout_s": rollout_s}
    job_id = api.post("/v1/jobs", json=job).json()["job_ids"][0]

    record = wait_status(api, job_id)

    assert record["status"] == "timed_out", record
    assert record["error"]["stage"] == "rollout", record
    assert "total wall-time limit" in record["error"]["message"], record
    t = record["timings"]
    deadline = record["created_at"] + total_s
    assert t["rollout"]["started"] - record["created_at"] >= 1.0, "init's time did not count toward the total"
    assert deadline <= t["rollout"]["ended"] < t["rollout"]["started"] + rollout_s, record
    assert record["finished_at"] - record["created_at"] >= total_s


def test_one_rollout_process_keeps_many_jobs_in_flight(make_stack, trace_dir, tmp_path):
    stack = make_stack(concurrency={"init": 4, "rollout": 4, "eval": 4})
    api = client_for(stack)
    gate = Gate(tmp_path / "release")
    ids = api.post("/v1/jobs", json=[scripted(trace_dir, **gate.hold("rollout")) for _ in range(4)]).json()["job_ids"]

    def rollouts_started() -> int:
        return sum(line.startswith("rollout start") for job_id in ids for line in trace(trace_dir, job_id))

    try:  # all four are held in the rollout stage at once before any may end
        wait_for(lambda: rollouts_started() == 4, what="four rollouts running at once")
    finally:
        gate.release()
    records = [wait_status(api, job_id) for job_id in ids]

    assert all(r["status"] == "done" for r in records)
    # one process ran all four rollouts ...
    processes = {r["workers"]["rollout"].rsplit(".", 1)[0] for r in records}
    assert len(processes) == 1
    # ... at the same time: every rollout started before any of them ended
    starts = [r["timings"]["rollout"]["started"] for r in records]
    ends = [r["timings"]["rollout"]["ended"] for r in records]
    assert max(starts) < min(ends)
    status = api.get("/v1/status").json()["stages"]["rollout"]
    assert status["processes"] == 1 and status["slots"] == 4
