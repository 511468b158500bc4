"""The trajectory viewer in a real browser: headless Chromium, driven by selenium, renders jobs the
real stage workers finished: one done (turns, tool calls, evaluation), one timed out in its rollout
(the partial trajectory), one failed (its error and traceback), behind the API's bearer-token auth.

Screenshots are kept after the run under $ROLLOUTS_TEST_ARTIFACTS/viewer (default
<repo>/test-artifacts/viewer) so a person can look at what the page showed (tests/observability/browser.py).
"""

from __future__ import annotations

import httpx
import pytest

from tests.observability.browser import needs_browser, screenshot, text_of
from tests.observability.viewer_kind import sample_trajectory
from tests.support.waiting import wait_status

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra has it)")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = needs_browser
TOKEN = "viewer-test-token"
VIEWER_ENV = {
    "ROLLOUTS_TASK_MODULES": "tests.support.kinds,tests.observability.viewer_kind",
    "ROLLOUTS_API_TOKENS": TOKEN,
}


def open_job(driver: webdriver.Chrome, api_url: str, job_id: str) -> str:
    """Open `#job=<id>` and wait until the page has rendered that job; returns the visible text."""
    driver.get(f"{api_url}/viewer#job={job_id}")
    try:
        # Read in one script: the previous job's page may be replaced between two WebDriver calls.
        title = "const t = document.getElementById('job-title'); return t && t.textContent"
        WebDriverWait(driver, 30).until(lambda d: d.execute_script(title) == f"job {job_id}")
    except TimeoutException:
        pytest.fail(f"job {job_id} was not rendered; the page says: {text_of(driver, 'message')!r}")
    text = driver.find_element(By.ID, "view").text
    assert "null" not in text.split() and "undefined" not in text, text
    return text


def test_the_viewer_shows_turns_evaluation_attempts_partial_trajectories_and_errors(make_stack, browser):
    stack = make_stack(env=VIEWER_ENV, token=TOKEN)
    api = httpx.Client(base_url=stack.api_url, timeout=10.0, headers={"Authorization": f"Bearer {TOKEN}"})

    def submit(job: dict) -> str:
        return api.post("/v1/jobs", json=job).json()["job_ids"][0]

    done_id = submit({"task": {"kind": "viewer-demo"}})
    # The limit runs from the take, before the rollout sets its partial: seconds of margin.
    timed_out_id = submit({"task": {"kind": "viewer-demo", "stall": True}, "limits": {"rollout_timeout_s": 3}})
    eval_timed_out_id = submit(
        {"task": {"kind": "viewer-demo", "stall_in_eval": True}, "limits": {"eval_timeout_s": 1}}
    )
    failed_id = submit({"task": {"kind": "scripted", "fail": "eval"}})
    swe_style_id = submit({"task": {"kind": "viewer-demo", "swe_style": True}})
    assert wait_status(api, done_id)["status"] == "done"
    assert wait_status(api, timed_out_id)["status"] == "timed_out"
    assert wait_status(api, eval_timed_out_id)["status"] == "timed_out"
    assert wait_status(api, failed_id)["status"] == "failed"
    assert wait_status(api, swe_style_id)["status"] == "done"

    # Without a token the API refuses, and the page says so; the token entered in the header opens it.
    browser.get(f"{stack.api_url}/viewer")
    WebDriverWait(browser, 30).until(lambda d: "401" in text_of(d, "message"))
    assert "enter a token" in text_of(browser, "message")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "save-token").click()
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#jobs tr.job"))
    listing = text_of(browser, "view")
    assert "5 jobs" in listing and all(job_id in listing for job_id in (done_id, timed_out_id, failed_id))
    screenshot(browser, "job-list")

    # Done: the model's turns with their token counts and tool calls, the evaluation, attempts and timings.
    page = open_job(browser, stack.api_url, done_id)
    expected = sample_trajectory()
    generated = sum(expected.loss_mask)
    assert text_of(browser, "job-status") == "done" and text_of(browser, "job-reward") == "0.75"
    assert text_of(browser, "turn-count") == "2"  # model turns, not prompt and observation spans
    assert text_of(browser, "tool-call-count") == "2"
    assert text_of(browser, "total-tokens") == str(len(expected.token_ids))
    assert text_of(browser, "prompt-tokens") == str(expected.prompt_length)
    assert text_of(browser, "generated-tokens") == str(generated) == "82"
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".turn h4 .turn-label")]
    assert labels == ["prompt", "turn 1 · model", "observation", "turn 2 · model"]
    tokens = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".turn h4 .tokens")]
    assert tokens == [f"{turn.end - turn.start} tokens" for turn in expected.turns]
    first = browser.find_elements(By.CSS_SELECTOR, ".turn h4")[1].text
    assert "backend cpu-1" in first and "mean logprob -0.500" in first
    tools = [call.get_attribute("data-tool") for call in browser.find_elements(By.CSS_SELECTOR, ".call")]
    assert tools == ["bash", "finish"]
    assert "echo $((6*7))" in page and "tool call: finish" in page
    assert text_of(browser, "evaluation-score") == "score 0.75"
    assert text_of(browser, "evaluation-reason") == "3 of 4 checks passed"
    tests = text_of(browser, "evaluation-tests")
    assert "tests: 3 of 4 passed" in page and "explains_the_steps wrong_output" in tests
    stage_rows = browser.find_elements(By.CSS_SELECTOR, "#stage-table tr[data-stage]")
    rows = {row.get_attribute("data-stage"): row.text for row in stage_rows}
    assert list(rows) == ["init", "rollout", "eval"]
    assert all(row.split()[1] == "1" for row in rows.values()), rows  # one attempt each
    assert "Attempts and timings" in page and "after submission" in text_of(browser, "timings")
    assert not browser.find_elements(By.ID, "error") and not browser.find_elements(By.ID, "partial-note")
    screenshot(browser, "done-job")

    # Tests in groups of {test: outcome}, as SWE-bench's evaluation reports them.
    page = open_job(browser, stack.api_url, swe_style_id)
    assert text_of(browser, "evaluation-score") == "score 0" and "tests: 1 of 2 passed" in page
    rows = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#evaluation-tests tr")]
    assert rows[1:] == [
        "FAIL_TO_PASS tests/test_x.py::test_fixed FAILED",
        "PASS_TO_PASS tests/test_x.py::test_kept PASSED",
    ]
    details = browser.find_element(By.CSS_SELECTOR, "#evaluation dl.details").text.split()
    assert details == ["resolved", "false"]  # the evaluator's other plain fields

    # Timed out in its rollout: the error says which limit, and the partial trajectory is shown.
    page = open_job(browser, stack.api_url, timed_out_id)
    assert text_of(browser, "job-status") == "timed_out"
    assert "Error in the rollout stage: timeout" in page and "job exceeded its rollout stage time limit" in page
    assert "Partial trajectory" in text_of(browser, "partial-note") and "Stop reason: timed_out" in page
    assert text_of(browser, "turn-count") == "1" and text_of(browser, "tool-call-count") == "1"
    assert "Partial trajectory: 1 model turns" in page and "No trajectory" not in page
    assert [c.get_attribute("data-tool") for c in browser.find_elements(By.CSS_SELECTOR, ".call")] == ["bash"]
    assert not browser.find_elements(By.ID, "evaluation")
    screenshot(browser, "timed-out-job")

    # Timed out in eval: the rollout had finished, so its whole trajectory is there, without an evaluation.
    page = open_job(browser, stack.api_url, eval_timed_out_id)
    assert "Error in the eval stage: timeout" in page and "The rollout finished; then the job timed_out" in page
    assert "Trajectory without an evaluation" in page and "Trajectory: 2 model turns" in page
    assert text_of(browser, "turn-count") == "2" and text_of(browser, "generated-tokens") == "82"
    assert "No trajectory" not in page and not browser.find_elements(By.ID, "evaluation")
    screenshot(browser, "eval-timed-out-job")

    # Failed in eval: stage, type and message at once; the traceback folded until asked for.
    page = open_job(browser, stack.api_url, failed_id)
    assert text_of(browser, "job-status") == "failed"
    assert "Error in the eval stage: RuntimeError" in page and "scripted failure in eval" in page
    traceback = browser.find_element(By.ID, "error-traceback")
    assert not traceback.is_displayed() and "Traceback" in traceback.get_attribute("textContent")
    browser.find_element(By.CSS_SELECTOR, "#error details > summary").click()
    try:
        WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "error-traceback").is_displayed())
    except TimeoutException:
        pytest.fail("the traceback did not unfold")
    assert "RuntimeError: scripted failure in eval" in traceback.text
    assert "The rollout's output has no turns" in page  # the scripted kind's rollout records none
    screenshot(browser, "failed-job")
