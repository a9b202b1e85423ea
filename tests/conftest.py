"""What every test module shares: the `--slow` switch and the session's one cubin folder.

`python -m pytest` runs the fast suite in parallel workers (pytest-xdist, `-n auto` in
pyproject.toml): tests marked `slow` (every nvcc build past the first, every committed measured run
past a sample) are deselected unless `--slow` is given or a test is named by its node id;
`.ci/run` gives `--slow`, so CI runs them all.
Tests marked `browser` (headless Chromium) run only when asked for: `-m browser`.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="also run the tests marked slow (every kernel build, every measured run): what CI runs")


def pytest_collection_modifyitems(config, items):
    asked = config.getoption("markexpr") or ""
    left_out = {m for m in ("slow", "browser") if m not in asked} - ({"slow"} if config.getoption("--slow") else set())
    named = [a.replace("\\", "/").split("tests/")[-1] for a in config.args if "::" in a]  # asked for by node id
    out = [item for item in items if any(item.get_closest_marker(m) for m in left_out)
           and not any(item.nodeid.split("tests/")[-1].startswith(n) for n in named)]
    if out:
        config.hook.pytest_deselected(items=out)
        items[:] = [item for item in items if item not in out]


@pytest.fixture(scope="session")
def cubin_cache(tmp_path_factory) -> Path:
    """One cubin folder for the whole session, every xdist worker included: a kernel one test
    built is reused by the others (gpu/build.py writes a cubin atomically under its key)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if base.name.startswith("popen-gw") else base) / "cubins"
