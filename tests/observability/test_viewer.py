"""The trajectory viewer in a real browser: headless Chromium renders the job list and one job's turns."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.waiting import client_for, wait_status

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it)")

VIEWER_ENV = {"ROLLOUTS_TASK_MODULES": "tests.support.kinds,tests.observability.viewer_kind"}


def chromium(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run, isolated: its own profile, no network beyond the page, no updates."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    argv = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={profile}", "--window-size=1200,900",
        # Let the page's fetches finish before the DOM is dumped or the screenshot taken.
        "--run-all-compositor-stages-before-draw", "--virtual-time-budget=15000",
        *args, url,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_the_viewer_lists_jobs_and_shows_a_trajectory_and_an_error(make_stack, tmp_path):
    stack = make_stack(env=VIEWER_ENV)
    api = client_for(stack)
    job_id = api.post("/v1/jobs", json={"task": {"kind": "viewer-demo"}}).json()["job_ids"][0]
    failed_id = api.post("/v1/jobs", json={"task": {"kind": "scripted", "fail": "eval"}}).json()["job_ids"][0]
    assert wait_status(api, job_id)["status"] == "done"
    assert wait_status(api, failed_id)["status"] == "failed"
    assert api.get("/viewer").headers["content-type"].startswith("text/html")

    listing = chromium(f"{stack.api_url}/viewer", tmp_path, "--dump-dom")
    assert listing.returncode == 0, listing.stderr[-2000:]
    assert job_id in listing.stdout and failed_id in listing.stdout
    assert "viewer-demo" in listing.stdout and "2 jobs" in listing.stdout

    page = f"{stack.api_url}/viewer#job={job_id}"
    detail = chromium(page, tmp_path, "--dump-dom").stdout
    assert f"job {job_id}" in detail
    assert '<span class="status-done" id="job-status">done</span>' in detail
    assert '<span id="job-reward">0.75</span>' in detail
    assert '<p id="evaluation-reason">3 of 4 checks passed</p>' in detail and "the last one" in detail
    assert '<span id="generated-tokens">82</span>' in detail  # the loss-masked tokens of both assistant turns
    assert "tool call: bash" in detail and "echo $((6*7))" in detail and "tool call: finish" in detail
    assert detail.count('class="turn ') == 4 and "backend cpu-1" in detail

    failed = chromium(f"{stack.api_url}/viewer#job={failed_id}", tmp_path, "--dump-dom").stdout
    assert "error in eval: RuntimeError" in failed and "scripted failure in eval" in failed

    shot = tmp_path / "job.png"
    taken = chromium(page, tmp_path, f"--screenshot={shot}")
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    image = pytest.importorskip("PIL.Image").open(shot).convert("RGB")
    assert image.size == (1200, 900)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is blank"
    # The dark header bar and the assistant turns' blue border are on screen.
    pixels = {colour for _, colour in colours}
    assert (0x1D, 0x23, 0x30) in pixels and (0x34, 0x61, 0xD9) in pixels

