"""The run page in a real browser: a live batch of a real stack (real stage workers, bearer auth), drawn from
GET /v1/run-stats while it runs and once it has ended. Checks the endpoint's numbers against the job
records, the page's rendered numbers and plotted data against the endpoint, that the page moves on its
own while jobs end, and that the CSV holds the same numbers. Screenshots: test-artifacts/viewer/run-page*.png.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path

import httpx
import pytest
from redis import Redis

from shared.keys import Keys
from shared.run_stats.fields import bucket_bounds, bucket_of
from shared.weights.versions import WeightVersions
from tests.observability.browser import needs_browser, screenshot, text_of
from tests.observability.viewer_kind import RUN_LLM_S, RUN_MODEL, sample_trajectory
from tests.support.waiting import wait_for

pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra has it)")
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = needs_browser
TOKEN = "run-page-token"
RUN_ID = "run-page-test"
ENV = {"ROLLOUTS_TASK_MODULES": "tests.observability.viewer_kind", "ROLLOUTS_API_TOKENS": TOKEN}
N_SAMPLES = 2


def prompts(release: Path) -> list[dict]:
    """Four groups: step-1 from the pool scoring 1, step-2 started scoring 0, step-2 failing in eval,
    and step-2 scoring 0.5 whose rollouts wait for the test's file: the batch stays live until then."""

    def prompt(**task: object) -> dict:
        return {"task": {"kind": "run-demo", "sandbox": "pool", **task}, "metadata": {"run_id": RUN_ID}}

    return [
        prompt(version="step-1", reward=1.0),
        prompt(version="step-2", reward=0.0, sandbox="started"),
        prompt(version="step-2", reward=0.5, fail=True),
        prompt(version="step-2", reward=0.5, hold={"rollout": str(release)}),
    ]


def fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_seconds(value: float | None) -> str:
    """As the page's `seconds()` writes one."""
    if value is None:
        return "-"
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s" if value < 600 else f"{value / 60:.1f} min"


def rendered(driver, element_id: str) -> str | None:
    """An element's text read in one script: the page may be replaced by its refresh between two calls."""
    return driver.execute_script(f"const e = document.getElementById('{element_id}'); return e && e.textContent")


def wait_rendered(driver, element_id: str, expected: str, timeout: float = 30.0) -> None:
    try:
        WebDriverWait(driver, timeout).until(lambda d: rendered(d, element_id) == expected)
    except TimeoutException:
        pytest.fail(
            f"#{element_id} never showed {expected!r}: {rendered(driver, element_id)!r}; {text_of(driver, 'message')!r}"
        )


def test_the_run_page_draws_a_live_batch_and_exports_the_same_numbers(make_stack, browser, tmp_path):
    stack = make_stack(env=ENV, token=TOKEN)
    api = httpx.Client(base_url=stack.api_url, timeout=10.0, headers={"Authorization": f"Bearer {TOKEN}"})
    versions = WeightVersions(Redis.from_url(stack.redis_url), Keys(stack.settings.redis_prefix))
    for label in ("step-1", "step-2"):  # step-2 is current: a step-1 sample is 1 behind
        versions.declare(RUN_MODEL, label, RUN_ID)
    release = tmp_path / "release"
    answer = api.post("/v1/batches", json={"prompts": prompts(release), "n_samples": N_SAMPLES})
    assert answer.status_code == 202, answer.text
    batch_id = answer.json()["id"]

    # Live: six jobs end while the held group waits; the page shows them without being reloaded.
    browser.get(f"{stack.api_url}/viewer#run&batch={batch_id}&refresh=1&token={TOKEN}")
    wait_rendered(browser, "run-jobs", "6")
    assert rendered(browser, "run-title") == f"Run page: batch {batch_id}"
    assert "live: read at" in rendered(browser, "run-live")
    screenshot(browser, "run-page-live")
    release.touch()
    wait_rendered(browser, "run-jobs", "8")
    wait_for(lambda: api.get(f"/v1/batches/{batch_id}").json()["status"] == "completed", timeout=30, what="the batch")

    # The endpoint against the records.
    stats = api.get("/v1/run-stats", params={"batch_id": batch_id}).json()
    jobs = [api.get(f"/v1/jobs/{job['id']}").json() for job in api.get("/v1/jobs", params={"limit": 50}).json()["jobs"]]
    assert len(jobs) == 8
    totals = stats["totals"]
    done = [job for job in jobs if job["status"] == "done"]
    assert (totals["jobs"], totals["done"], totals["failed"]) == (8, 6, 2)
    assert totals["reward_mean"] == pytest.approx(statistics.mean(job["result"]["reward"] for job in done))
    per_version = {row["version"]: (row["seq"], row["rewards"], row["reward_mean"]) for row in stats["versions"]}
    assert per_version == {"step-1": (1, 2, 1.0), "step-2": (2, 4, 0.25)}
    generated = sample_trajectory().counts.generated_tokens
    assert all(job["result"]["trajectory"]["counts"]["generated_tokens"] == generated for job in done)
    assert totals["generated_tokens"] == 8 * generated  # every rollout finished, the failed ones' too
    rollout_s = [job["timings"]["rollout"]["ended"] - job["timings"]["rollout"]["started"] for job in jobs]
    assert totals["llm_share"] == pytest.approx(8 * RUN_LLM_S / sum(rollout_s), rel=1e-6)
    assert (totals["sandbox_pool"], totals["sandbox_started"]) == (6, 2)
    assert stats["staleness"] == [{"behind": 0, "jobs": 6}, {"behind": 1, "jobs": 2}]
    assert stats["failures"] == [{"reason": "failed: eval RuntimeError", "jobs": 2}]
    stages = {row["stage"]: row for row in stats["stages"]}
    assert stages["rollout"]["count"] == 8 and stages["eval"]["count"] == 8
    low, high = bucket_bounds(bucket_of(statistics.median_low(rollout_s)))
    assert low <= stages["rollout"]["p50_s"] <= bucket_bounds(bucket_of(statistics.median_high(rollout_s)))[1]
    assert stages["rollout"]["mean_s"] == pytest.approx(statistics.mean(rollout_s), rel=1e-6) and low < high

    # The page against the endpoint: facts, tables and the plotted data.
    browser.get(f"{stack.api_url}/viewer#run&batch={batch_id}&until={math.ceil(stats['scope']['until'])}")
    wait_rendered(browser, "run-live", "a closed window")
    page = browser.execute_script("return window.runStats")
    assert page["totals"] == totals and page["versions"] == stats["versions"]
    for element_id, value in {
        "run-jobs": "8",
        "run-done": "6",
        "run-failed": "2",
        "run-reward": fmt(totals["reward_mean"], 3),
        "run-generated": str(totals["generated_tokens"]),
        "run-tokens-per-s": fmt(totals["tokens_per_s"], 1),
        "run-llm-share": f"{totals['llm_share'] * 100:.1f}%",
        "run-pool-hits": "6 of 8 (75.0%)",
    }.items():
        assert rendered(browser, element_id) == value, element_id
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#run-stages tr[data-key]')].map(r => [...r.cells].map(c => c.textContent))"
    )
    expected = [
        [row["stage"], str(row["count"]), *(fmt_seconds(row[f]) for f in ("mean_s", "p50_s", "p90_s"))]
        for row in stats["stages"]
    ]
    assert rows == expected
    versions_rows = browser.execute_script(
        "return [...document.querySelectorAll('#run-versions tr[data-key]')].map(r => [...r.cells].map(c => c.textContent))"
    )
    assert versions_rows == [["step-1", "1", "2", "1.000"], ["step-2", "2", "4", "0.250"]]
    charts = browser.execute_script("return Object.fromEntries(Object.entries(runCharts).map(([k, c]) => [k, c.data]))")
    assert set(charts) == {
        "reward-by-version",
        "reward-by-minute",
        "jobs-per-minute",
        "tokens-per-second",
        "llm-share",
        "staleness",
    }
    assert charts["reward-by-version"] == [[1, 2], [1.0, 0.25], [1.0, 0.25]]
    assert charts["staleness"] == [[0, 1], [6, 2]]
    assert sum(charts["jobs-per-minute"][1]) == 6 and sum(charts["jobs-per-minute"][2]) == 2
    assert browser.execute_script("return document.querySelectorAll('.chart canvas').length") == 6
    screenshot(browser, "run-page")

    # The CSV: the same numbers, through the page's own token, and as the API answers it.
    text = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "apiFetch(statsPath(runParams(), 'csv'), 'text/csv').then(r => r.text()).then(done, e => done(String(e)));"
    )
    cells = {(s, k, f): v for s, k, f, v in list(csv.reader(io.StringIO(text)))[1:]}
    assert (
        int(cells[("totals", "", "jobs")]) == 8 and float(cells[("totals", "", "reward_mean")]) == totals["reward_mean"]
    )
    assert float(cells[("version", "2", "reward_mean:run-demo")]) == 0.25
    assert cells[("failure", "failed: eval RuntimeError", "jobs")] == "2"
    assert float(cells[("stage", "rollout", "p50_s")]) == stages["rollout"]["p50_s"]

    # The run's scope holds the same jobs, and the picker offers the run and the batch.
    browser.get(f"{stack.api_url}/viewer#run&run={RUN_ID}")
    wait_rendered(browser, "run-jobs", "8")
    recent = rendered(browser, "run-recent")
    assert f"run {RUN_ID}" in recent and f"batch {batch_id}" in recent
