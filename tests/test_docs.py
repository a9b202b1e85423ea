"""Every walkthrough in docs/ runs as written and prints what its text says (tests/docs_runner.py)."""

import re
from pathlib import Path

import pytest
from docs_runner import matches, parse, run

WALKTHROUGHS = sorted((Path(__file__).parent.parent / "docs").glob("[0-9][0-9]-*.md"))
REFERENCE = sorted((Path(__file__).parent.parent / "docs" / "reference").glob("*.md"))  # run the same way


@pytest.mark.parametrize("path", WALKTHROUGHS + REFERENCE, ids=lambda p: p.stem)
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


DOCS = Path(__file__).parent.parent / "docs"
IMAGE = re.compile(r"!\[[^\]]*\]\((?:\.\./)?(img/[^)\s]+)\)")


@pytest.mark.parametrize("path", WALKTHROUGHS + REFERENCE, ids=lambda p: p.stem)
def test_walkthrough_figures_exist_are_small_and_show_their_command(path):
    """Every figure a walkthrough shows is committed under docs/img/, under 200 KB, and the
    command that made it (naming its path) follows it before the next figure or heading."""
    text = path.read_text()
    for m in IMAGE.finditer(text):
        img = DOCS / m.group(1)
        assert img.is_file(), f"{path.name} shows {m.group(1)}, which is not in docs/img/"
        assert img.stat().st_size < 200_000, f"{img.name} is {img.stat().st_size} bytes; keep figures < 200 KB"
        after = re.split(r"\n#|!\[", text[m.end():], maxsplit=1)[0]
        assert f"docs/{m.group(1)}" in after, f"{path.name}: no command writing docs/{m.group(1)} next to it"


def test_docs_readme_lists_every_walkthrough_in_order():
    listed = re.findall(r"\]\((\d\d-[^)]+\.md)\)", (DOCS / "README.md").read_text())
    assert listed == [p.name for p in WALKTHROUGHS]
