"""The app in a real browser: `moelab app` served headless, opened in headless Chromium.

Waits for the Simulate page's timeline chart, checks its title and that it drew bars, and saves a
screenshot to artifacts/app-simulate.png. Run on purpose, `python -m pytest -m browser`, where
chromium and chromedriver are installed (skipped without them); the suite and CI deselect it.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import sim

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.browser
if not (CHROMIUM and DRIVER):
    pytest.skip("chromium and chromedriver are not installed (apt-get install chromium "
                "chromium-driver)", allow_module_level=True)

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1600,1300")
CHART_JS = """
const plots = [...document.querySelectorAll('.js-plotly-plot')];
const g = plots.find(p => (p.querySelector('.gtitle') || {}).textContent?.startsWith('Timeline'));
if (!g) return null;
return {title: g.querySelector('.gtitle').textContent,
        bars: g.querySelectorAll('.trace.bars .point path').length};
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"{what} not within {timeout:.0f} s")


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.skipif(not hasattr(sim, "simulate"), reason="sim.simulate has not landed")
def test_timeline_renders_in_chromium(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    port = free_port()
    log = (tmp_path / "app.log").open("w")
    app = subprocess.Popen(
        [sys.executable, "-c", "import sys; from moelab.cli import main; sys.exit(main())",
         "app", "--port", str(port), "--headless"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    driver = None
    try:
        wait_until(lambda: healthy(port) or app.poll() is not None, 60, "the app's health check")
        assert app.poll() is None, (tmp_path / "app.log").read_text()
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
            opts.add_argument(flag)
        driver = webdriver.Chrome(options=opts, service=Service(DRIVER))
        driver.set_page_load_timeout(60)
        driver.get(f"http://127.0.0.1:{port}/")
        chart = wait_until(lambda: (c := driver.execute_script(CHART_JS)) and c["bars"] and c,
                           120, "the timeline chart with bars")
        assert chart["title"].startswith("Timeline: small")
        assert chart["bars"] > 100
        time.sleep(1)  # let the metrics table finish painting before the picture
        shot = ROOT / "artifacts" / "app-simulate.png"
        shot.parent.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        if driver is not None:
            driver.quit()
        os.killpg(app.pid, signal.SIGTERM)  # moelab app and the streamlit server it started
        try:
            app.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(app.pid, signal.SIGKILL)
            app.wait()
        log.close()
