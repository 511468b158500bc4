"""Prometheus /metrics: worker aggregates in Redis and scrape-time gauges, parsed as Prometheus would."""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from shared.backend_pool import BackendPool
from shared.keys import Keys
from shared.metrics import STAGE_SECONDS, MetricsRecorder
from tests.support.waiting import client_for, wait_for, wait_status


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(parsed, name: str, **labels: str) -> float:
    return parsed[(name, tuple(sorted(labels.items())))]


def test_recorded_observations_come_out_as_a_cumulative_histogram_and_counters(settings, redis):
    recorder = MetricsRecorder(redis, "ro")
    for seconds in (0.03, 0.07, 0.07, 4.0, 7200.0):
        recorder.stage_attempt("rollout", "queued:eval", seconds)
    recorder.stage_attempt("eval", "failed", 1.5)
    recorder.stage_attempt("init", "skipped:cancelled", 9.0)  # did not run: no latency
    recorder.error("eval", "RuntimeError")
    recorder.error("eval", "RuntimeError")
    recorder.tool_calls(
        {
            "turns": [
                {
                    "tool_calls": [
                        {"name": "bash", "duration_s": 0.2},
                        {"name": None, "error": "malformed", "duration_s": 0.0},
                    ]
                },
                {"tool_calls": [{"name": "python", "duration_s": 1.2}]},
            ]
        }
    )

    with TestClient(create_app(settings)) as client:
        response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    parsed = samples(response.text)

    name = STAGE_SECONDS.name
    assert value(parsed, f"{name}_bucket", stage="rollout", outcome="ok", le="0.05") == 1
    assert value(parsed, f"{name}_bucket", stage="rollout", outcome="ok", le="0.1") == 3
    assert value(parsed, f"{name}_bucket", stage="rollout", outcome="ok", le="3600.0") == 4
    assert value(parsed, f"{name}_bucket", stage="rollout", outcome="ok", le="+Inf") == 5
    assert value(parsed, f"{name}_count", stage="rollout", outcome="ok") == 5
    assert abs(value(parsed, f"{name}_sum", stage="rollout", outcome="ok") - 7204.17) < 1e-6
    assert value(parsed, f"{name}_count", stage="eval", outcome="failed") == 1
    assert not any(k[0].startswith(name) and ("stage", "init") in k[1] for k in parsed)
    assert value(parsed, "rollouts_errors_total", stage="eval", kind="RuntimeError") == 2
    assert value(parsed, "rollouts_tool_call_duration_seconds_count", tool="bash") == 1
    assert value(parsed, "rollouts_tool_call_duration_seconds_count", tool="python") == 1
    assert ("rollouts_tool_call_duration_seconds_count", (("tool", "invalid"),)) not in parsed


def test_scrape_time_gauges_read_jobs_queues_and_the_backend_pool(settings, redis):
    pool = BackendPool(redis, Keys(), settings)
    pool.register("http://127.0.0.1:9/", "tiny", capacity=2, backend_id="b1")
    pool.register("http://127.0.0.1:8/", "tiny", capacity=1, backend_id="b2")
    pool.acquire("job-a")
    pool.acquire("job-b")
    pool.acquire("job-c")
    with TestClient(create_app(settings)) as client:
        client.post("/v1/jobs", json=[{"task": {"kind": "demo", "text": "x"}}] * 3)
        parsed = samples(client.get("/metrics").text)

    assert value(parsed, "rollouts_jobs", status="queued") == 3
    assert value(parsed, "rollouts_jobs", status="done") == 0
    assert value(parsed, "rollouts_queue_depth", stage="init") == 3
    assert value(parsed, "rollouts_queue_depth", stage="rollout") == 0
    inflight = {b: value(parsed, "rollouts_backend_inflight", backend=b, model="tiny") for b in ("b1", "b2")}
    assert inflight == {"b1": 2, "b2": 1}
    assert value(parsed, "rollouts_backend_healthy", backend="b1", model="tiny") == 1
    assert value(parsed, "rollouts_dapo_filtered_groups") == 0


def test_metrics_need_a_token_when_auth_is_on(settings):
    with TestClient(create_app(settings.model_copy(update={"api_tokens": ["t"]}))) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"authorization": "Bearer t"}).status_code == 200


def test_a_live_stack_reports_stage_latencies_and_errors_by_kind(make_stack):
    stack = make_stack()
    api = client_for(stack)
    ok = api.post("/v1/jobs", json=[{"task": {"kind": "scripted"}}] * 3).json()["job_ids"]
    bad = api.post("/v1/jobs", json={"task": {"kind": "scripted", "fail": "rollout"}}).json()["job_ids"][0]
    for job_id in [*ok, bad]:
        wait_status(api, job_id)

    expected = {
        ("rollouts_jobs", (("status", "done"),)): 3,
        ("rollouts_jobs", (("status", "failed"),)): 1,
        ("rollouts_stage_duration_seconds_count", (("outcome", "ok"), ("stage", "init"))): 4,
        ("rollouts_stage_duration_seconds_count", (("outcome", "ok"), ("stage", "eval"))): 3,
        ("rollouts_stage_duration_seconds_count", (("outcome", "ok"), ("stage", "rollout"))): 3,
        ("rollouts_stage_duration_seconds_count", (("outcome", "failed"), ("stage", "rollout"))): 1,
        ("rollouts_errors_total", (("kind", "RuntimeError"), ("stage", "rollout"))): 1,
    }

    def scraped():
        # Workers flush their metrics every heartbeat, so the last attempts show up a moment later.
        parsed = samples(httpx.get(f"{stack.api_url}/metrics").text)
        return parsed if all(parsed.get(key) == want for key, want in expected.items()) else None

    parsed = wait_for(scraped, timeout=30, what=f"/metrics to report {expected}")
    assert value(parsed, "rollouts_worker_slots", stage="rollout", state="idle") >= 1


def test_rollout_outputs_without_a_trajectory_record_no_tool_calls():
    from shared.metrics import tool_call_durations

    for output in ({"turns": 1}, {"turns": [1, {"tool_calls": 3}]}, [], None, {"turns": [{"tool_calls": [7]}]}):
        assert tool_call_durations(output) == []
