"""The trainers of bench/load.py, as locust users: each loops submit one job, long-poll it to its end, read it.

Run by bench.load as `locust -f bench/load_locustfile.py --headless ... --jobs-file F --ids-out F`, never
imported by the project: locust patches the standard library with gevent on import, so it stays in a
process of its own, and this file imports nothing of the project's (the bench checks the jobs).

The jobs come from `--jobs-file` (a JSON list, handed out in order, each once); every submitted id is
appended to `--ids-out` as `<index> <id>` at once, so the bench knows them even if locust dies. Once every
job handed out has been read back, the runner quits. Requests as locust names them: `submit`
(POST /v1/jobs, one job), `poll` (GET /v1/jobs?ids=<id>&wait_s=..., again until the job ends: mostly
waiting), `read` (GET /v1/jobs/{id}); and `end -> poll answer` (request type LAG, no request of its own):
from the job's end, as its record times it, to the long poll's answer arriving.
"""

from __future__ import annotations

import json
import time
from typing import Any

import gevent
from locust import FastHttpUser, constant, events, task
from locust.env import Environment

TERMINAL = {"done", "failed", "cancelled", "timed_out"}  # shared.jobs.status.TERMINAL, not imported (above)


class Plan:
    """The jobs still to hand out and how many have been seen through; one per locust process (greenlets share it)."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []
        self.next = 0
        self.finished = 0
        self.ids_out: Any = None

    def take(self) -> tuple[int, dict[str, Any]] | None:
        if self.next >= len(self.jobs):
            return None
        self.next += 1
        return self.next - 1, self.jobs[self.next - 1]

    def submitted(self, index: int, job_id: str) -> None:
        self.ids_out.write(f"{index} {job_id}\n")
        self.ids_out.flush()

    def finish(self, environment: Environment) -> None:
        """One job seen through (read back, or given up on a failure); the last one ends the run."""
        self.finished += 1
        if self.finished == len(self.jobs) and environment.runner is not None:
            gevent.spawn(environment.runner.quit)  # not from this user's greenlet, which quit() kills


PLAN = Plan()


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--jobs-file", required=True, help="a JSON list of jobs to submit, each once")
    parser.add_argument("--ids-out", required=True, help="where each submitted job's `<index> <id>` goes")
    parser.add_argument("--wait-s", type=float, default=30.0, help="each long poll's wait_s")
    parser.add_argument("--summary-out", required=True, help="the final per-request figures, as JSON")


@events.init.add_listener
def _load(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    if options is None:
        return
    with open(options.jobs_file) as jobs:
        PLAN.jobs = json.load(jobs)
    PLAN.ids_out = open(options.ids_out, "a")  # noqa: SIM115 - open for the process's life
    Trainer.network_timeout = options.wait_s + 30.0  # a long poll may take its whole wait


@events.quitting.add_listener
def _summary(environment: Environment, **_: Any) -> None:
    """The final figures, by locust's own percentiles: its --csv file is rewritten once a second, so its last
    write can miss the run's last requests."""
    stats = environment.stats
    rows = {
        entry.name: {
            "count": entry.num_requests,
            "failures": entry.num_failures,
            "p50": entry.get_response_time_percentile(0.5),
            "p99": entry.get_response_time_percentile(0.99),
            "max": entry.max_response_time,
        }
        for entry in stats.entries.values()
    }
    errors = [f"{e.method} {e.name} x{e.occurrences}: {e.error}" for e in stats.errors.values()]
    with open(environment.parsed_options.summary_out, "w") as out:
        json.dump({"requests": rows, "errors": errors}, out)


class Trainer(FastHttpUser):
    """One trainer-side client: one job in flight at a time, seen through to its record."""

    wait_time = constant(0)

    @task
    def one_job(self) -> None:
        taken = PLAN.take()
        if taken is None:
            gevent.sleep(1.0)  # all handed out: idle until the last one is read and the runner quits
            return
        try:
            self._see_through(*taken)
        finally:
            PLAN.finish(self.environment)

    def _see_through(self, index: int, job: dict[str, Any]) -> None:
        with self.client.post("/v1/jobs", json=job, name="submit", catch_response=True) as response:
            if response.status_code != 202:
                response.failure(f"{response.status_code}: {response.text[:300]}")
                return
            job_id = response.json()["job_ids"][0]
        PLAN.submitted(index, job_id)
        wait_s = self.environment.parsed_options.wait_s
        while True:
            url = f"/v1/jobs?ids={job_id}&wait_s={wait_s:g}"
            with self.client.get(url, name="poll", catch_response=True) as response:
                rows = response.json()["jobs"] if response.status_code == 200 else None
                if not rows:
                    response.failure(f"{response.status_code}: {response.text[:300]}")
                    return
                if rows[0]["status"] in TERMINAL:
                    answered = time.time()
                    break
        with self.client.get(f"/v1/jobs/{job_id}", name="read", catch_response=True) as response:
            record = response.json() if response.status_code == 200 else {}
            if record.get("status") != "done":
                response.failure(f"{response.status_code}: {response.text[:300]}")
                return
        ended = record["timings"]["eval"]["ended"]
        self.environment.events.request.fire(
            request_type="LAG",
            name="end -> poll answer",
            response_time=max(0.0, answered - ended) * 1000,
            response_length=0,
            exception=None,
            context={},
        )
