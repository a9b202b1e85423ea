"""Every walkthrough in docs/ runs as written and prints what its text says (tests/docs_runner.py)."""

from pathlib import Path

import pytest
from docs_runner import matches, parse, run

WALKTHROUGHS = sorted((Path(__file__).parent.parent / "docs").glob("[0-9][0-9]-*.md"))


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_walkthrough_runs_and_matches_its_text(path):
    checks = run(path)
    assert any(c.expected is not None for c in checks), f"{path.name} shows no output to check"
    for c in checks:
        if c.expected is not None:
            assert matches(c.expected, c.actual), f"{path.name}: `{c.code.strip()[:80]}` printed\n{c.actual}"


def test_runner_matching_rules():
    assert matches("a ... c\n...\nz\n", "a b c\nx\ny\nz\n")
    assert matches("a\n", "a  \n") and not matches("a\n", "a\nb\n") and not matches("a ... c", "a b d")
    text = "```python\nprint(1)\n```\n\n```text\n1\n```\n```console\n$ echo hi\nhi\n$ true\n```\n"
    checks = parse(text)
    assert [(c.lang, c.expected) for c in checks] == [("python", "1\n"), ("console", "hi\n"), ("console", "")]
