"""Headless Chromium through selenium for the viewer's tests: the driver fixture, screenshots, element text.

Screenshots are kept after the run under $ROLLOUTS_TEST_ARTIFACTS/viewer (default
<repo>/test-artifacts/viewer) so a person can look at what the page showed. A test marked
`needs_browser` is skipped, saying why, where selenium, chromium or chromedriver is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:  # the dev extra has it; without it the tests say so
    webdriver = None  # type: ignore[assignment]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(
    webdriver is None or CHROMIUM is None or CHROMEDRIVER is None,
    reason="selenium (the dev extra), chromium and chromium-driver are needed (scripts/setup.sh test installs them)",
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ROLLOUTS_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "viewer"


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def text_of(driver: Any, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def screenshot(driver: Any, name: str) -> Path:
    """The whole page, not just the window: the window grows to the document's height first."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(1000, min(int(height) + 120, 6000)))
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    print(f"viewer screenshot: {path}")
    driver.set_window_size(1280, 1000)
    return path
