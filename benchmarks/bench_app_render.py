"""How many Gantt bars the app's timeline can draw responsively: the bound behind lanes.MAX_BARS.

Builds app.charts.gantt figures of N bars (64 rows, every kind) and times, in headless Chromium,
the first draw (Plotly.newPlot) and a zoom (Plotly.relayout of the x range) after it. Needs
chromium and chromedriver (Debian packages) and selenium. Usage:

    python benchmarks/bench_app_render.py [N ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import plotly

from app.charts import gantt
from app.lanes import Bars, Rows
from sim.trace import KINDS

PAGE = """<html><head><meta charset="utf-8"><script src="{js}"></script></head><body>
<div id="g" style="width:1400px"></div><script>
const fig = {fig};
const t0 = performance.now();
Plotly.newPlot('g', fig.data, fig.layout).then(() => {{
  window.t_draw = performance.now() - t0;
  const t1 = performance.now();
  Plotly.relayout('g', {{'xaxis.range': [100, 400]}}).then(() => {{
    window.t_zoom = performance.now() - t1; }});
}});
</script></body></html>"""


def figure_of(n: int, n_rows: int = 64):
    rng = np.random.default_rng(0)
    row = np.arange(n) % n_rows
    start = np.sort(rng.uniform(0, 1e6, n))
    rows = Rows([f"GPU{r // 16} SM {r % 16}" for r in range(n_rows)], np.arange(n_rows) // 16,
                np.ones(n_rows, np.int64), np.zeros(0, np.int64))
    kind = np.arange(n) % (len(KINDS) - 1)
    bars = Bars(row, start, start + rng.uniform(100, 2000, n), kind, np.ones(n),
                np.full(n, 3), np.arange(n), np.full(n, 1), np.full(n, 4096), None, 0.0)
    return gantt([("", rows, bars)], f"{n} bars")


def measure(sizes: list[int]) -> list[tuple[int, float, float]]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    tmp = Path(tempfile.mkdtemp())
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp / 'profile'}", "--window-size=1500,1200"):
        opts.add_argument(flag)
    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    driver = webdriver.Chrome(options=opts, service=Service("/usr/bin/chromedriver"))
    out = []
    try:
        for n in sizes:
            page = tmp / f"g{n}.html"
            page.write_text(PAGE.format(js=js.as_uri(), fig=figure_of(n).to_json()))
            driver.get(page.as_uri())
            deadline = time.monotonic() + 120
            while driver.execute_script("return window.t_zoom") is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{n} bars did not draw in 120 s")
                time.sleep(0.05)
            out.append((n, driver.execute_script("return window.t_draw") / 1e3,
                        driver.execute_script("return window.t_zoom") / 1e3))
    finally:
        driver.quit()
    return out


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:]] or [1_000, 5_000, 10_000, 20_000, 50_000, 100_000]
    print(f"{'bars':>8} {'draw (s)':>9} {'zoom (s)':>9}")
    for n, draw, zoom in measure(sizes):
        print(f"{n:>8} {draw:>9.2f} {zoom:>9.2f}")
