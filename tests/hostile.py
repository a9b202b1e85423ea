"""The hostile-input suite's one rule: run `moelab` in-process with a bound on the time, and hold
every bad input to exit status 2 (or the status named), one line on stderr naming what is wrong,
no traceback, no hang, no silent success."""

from __future__ import annotations

import contextlib
import io
import signal
import time

from moelab.cli import main

TIMEOUT_S = 20  # every case well under: a hang fails the case, not the suite


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def run(argv: list[str], timeout_s: int = TIMEOUT_S) -> tuple[int, str, str, float]:
    """`moelab argv` in this process: (status, stdout, stderr, seconds); a hang raises AssertionError."""
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout_s)
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    except Hang:
        raise AssertionError(f"moelab {' '.join(argv)} hung (over {timeout_s} s)") from None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def refused(argv: list[str], needle: str = "", status: int = 2, timeout_s: int = TIMEOUT_S) -> str:
    """Assert `moelab argv` refuses: `status`, its last stderr line the one error line (holding
    `needle`), no traceback, nothing after the error. Returns that line."""
    rc, out, err, _ = run(argv, timeout_s)
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, f"moelab {' '.join(argv)}: traceback\n{err}"
    assert rc == status, f"moelab {' '.join(argv)}: exit {rc}, not {status}\nstdout: {out[-800:]}\nstderr: {err[-800:]}"
    assert lines, f"moelab {' '.join(argv)}: exit {rc} with nothing said on stderr"
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1 and lines[-1] == errors[0], f"moelab {' '.join(argv)}: not one error line\n{err}"
    assert needle in errors[0], f"moelab {' '.join(argv)}: {needle!r} not in {errors[0]!r}"
    return errors[0]
