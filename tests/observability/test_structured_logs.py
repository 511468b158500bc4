"""Log records carry the job id, stage (and backend, where bound) of the thread's stage, as JSON fields."""

from __future__ import annotations

import io
import json
import logging
import threading

from shared.log_context import ContextFilter, bind
from shared.logs import JsonFormatter
from tests.support.waiting import client_for, wait_status


def _capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test.structured.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_bound_fields_appear_in_json_records_and_only_in_their_own_thread():
    logger, stream = _capture(JsonFormatter())

    def slot(job_id: str, stage: str, ready: threading.Barrier) -> None:
        with bind(job_id=job_id, stage=stage):
            ready.wait()  # both threads are inside their block at once
            logger.info("working")
            with bind(backend="b-7"):
                logger.info("generating")

    ready = threading.Barrier(2)
    threads = [
        threading.Thread(target=slot, args=(f"job-{i}", stage, ready)) for i, stage in enumerate(("init", "eval"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    logger.info("outside")

    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    by_job = {(e.get("job_id"), e.get("stage"), e.get("backend"), e["msg"]) for e in entries}
    assert ("job-0", "init", None, "working") in by_job and ("job-0", "init", "b-7", "generating") in by_job
    assert ("job-1", "eval", None, "working") in by_job and ("job-1", "eval", "b-7", "generating") in by_job
    assert entries[-1] == {k: entries[-1][k] for k in ("ts", "level", "logger", "msg")}  # nothing bound


def test_the_text_format_shows_the_context():
    logger, stream = _capture(logging.Formatter("%(levelname)s%(context)s: %(message)s"))
    with bind(job_id="abc", stage="rollout"):
        logger.warning("slow")
    logger.warning("plain")
    assert stream.getvalue().splitlines() == ["WARNING [job=abc stage=rollout]: slow", "WARNING: plain"]


def test_a_workers_json_log_names_the_job_and_stage_of_a_failure(make_stack, tmp_path):
    stack = make_stack(env={"ROLLOUTS_LOG_JSON": "true"})
    api = client_for(stack)
    job_id = api.post("/v1/jobs", json={"task": {"kind": "scripted", "fail": "rollout"}}).json()["job_ids"][0]
    assert wait_status(api, job_id)["status"] == "failed"

    lines = (tmp_path / "logs" / "rollout-0.log").read_text().splitlines()
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    failures = [e for e in entries if "failed" in e["msg"] and e.get("job_id") == job_id]
    assert failures and failures[0]["stage"] == "rollout" and failures[0]["level"] == "WARNING"
