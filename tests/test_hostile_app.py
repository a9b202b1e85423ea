"""Hostile inputs in the app: a config too large for a page is an error on the page (the estimate
and what to reduce), never a traceback or a page that hangs in the simulator."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


@pytest.mark.parametrize("view,field,value", [("simulate", "tokens", 10**9), ("golden", "tokens", 10**9),
                                              ("simulate", "ranks", 1024)])
def test_a_config_too_large_for_the_page_is_an_error_on_it(view, field, value):
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    if view != "simulate":
        at.switch_page(f"views/{view}.py").run()
    if field == "ranks":
        at.sidebar.number_input(key="cfg.experts").set_value(1024).run()
    at.sidebar.number_input(key=f"cfg.{field}").set_value(value).run()
    assert not at.exception, [e.message for e in at.exception]
    messages = [e.value for e in at.error]
    assert any("too large for the app" in m and "reduce" in m for m in messages), messages
    assert not at.metric
