"""Runs the code of a walkthrough in docs/ and compares what it prints with what the text says.

The rules a walkthrough follows (docs/README.md repeats them for authors):
- ```python blocks run in order, in one namespace per walkthrough, from the repository root. A
  ```text block right after a python block is that block's expected output.
- ```console blocks hold `$ command` lines, run with bash from the repository root; the lines
  after a command, up to the next `$`, are its expected output.
- In expected output, `...` matches any text within a line and a line holding only `...`
  matches any number of lines; trailing spaces are ignored.

    python tests/docs_runner.py docs/01-*.md            # check
    python tests/docs_runner.py --update docs/01-*.md   # rewrite the expected outputs
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)


@dataclass
class Check:
    """One piece of code and what the walkthrough says it prints."""

    code: str
    lang: str  # "python" or "console"
    expected: str | None
    span: tuple[int, int] | None  # where the expected text sits in the file (for --update)
    actual: str = ""


def parse(text: str) -> list[Check]:
    blocks = list(FENCE.finditer(text))
    checks = []
    for i, m in enumerate(blocks):
        if m.group(1) == "python":
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            follows = nxt is not None and nxt.group(1) == "text" and not text[m.end(): nxt.start()].strip()
            checks.append(Check(m.group(2), "python", nxt.group(2) if follows else None,
                                nxt.span(2) if follows else None))
        elif m.group(1) == "console":
            checks.extend(_console_checks(m.group(2), m.start(2)))
    return checks


def _console_checks(body: str, offset: int) -> list[Check]:
    checks, pos = [], 0
    lines = body.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            raise ValueError(f"console block line {line!r} is neither a `$ command` nor its output")
        start_out = pos + len(line)
        j = i + 1
        out_len = 0
        while j < len(lines) and not lines[j].startswith("$ "):
            out_len += len(lines[j])
            j += 1
        checks.append(Check(line[2:].rstrip("\n"), "console", "".join(lines[i + 1: j]),
                            (offset + start_out, offset + start_out + out_len)))
        pos = start_out + out_len
        i = j
    return checks


def matches(expected: str, actual: str) -> bool:
    exp = [line.rstrip() for line in expected.rstrip("\n").splitlines()]
    act = [line.rstrip() for line in actual.rstrip("\n").splitlines()]
    pattern = "".join("(?:.*\n)*?" if line == "..." else re.escape(line).replace(r"\.\.\.", ".*") + "\n"
                      for line in exp)
    return re.fullmatch(pattern, "\n".join(act) + "\n" if act else "") is not None


def run(path: Path, timeout: float = 600) -> list[Check]:
    """Execute every check of the walkthrough at `path`, filling `actual`."""
    checks = parse(path.read_text())
    namespace: dict = {"__name__": "__walkthrough__"}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "COLUMNS": "120"}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for check in checks:
            if check.lang == "python":
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    exec(compile(check.code, f"{path.name}", "exec"), namespace)  # noqa: S102
                check.actual = buf.getvalue()
            else:
                proc = subprocess.run(["bash", "-c", check.code], capture_output=True, text=True,
                                      timeout=timeout, env=env, cwd=ROOT)
                if proc.returncode:
                    raise RuntimeError(f"{path.name}: `{check.code}` exited {proc.returncode}:\n{proc.stderr}")
                check.actual = proc.stdout
    finally:
        os.chdir(cwd)
    return checks


def update(path: Path, checks: list[Check]) -> None:
    text = path.read_text()
    for check in sorted((c for c in checks if c.span), key=lambda c: c.span[0], reverse=True):
        lo, hi = check.span
        text = text[:lo] + check.actual.rstrip("\n") + "\n" + text[hi:]
    path.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description="check (or --update) the outputs of walkthroughs")
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--update", action="store_true", help="write actual outputs into the files")
    args = ap.parse_args()
    bad = 0
    for path in args.paths:
        checks = run(path)
        if args.update:
            update(path, checks)
        for c in checks:
            if c.expected is not None and not args.update and not matches(c.expected, c.actual):
                bad += 1
                print(f"{path}: output differs for\n{c.code}\n--- expected\n{c.expected}--- actual\n{c.actual}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
