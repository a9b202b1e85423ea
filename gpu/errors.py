"""The kernel's error record, decoded: which rank, block and wait gave up, and why.

The kernel writes 11 int64 words (kernels/params.cuh, ERROR_WORDS): flag, rank, block, thread,
what, a, b, c, value, expected, waited_ns. Only the first failure is recorded; after it every
other wait returns at once, so a launch always ends.
"""

from __future__ import annotations

import numpy as np

ERROR_WORDS = 11
_WHAT = {
    1: ("barrier", "grid barrier {a} (arrivals {value} of {expected}: are all blocks co-resident?)"),
    2: ("count", "the row count (c = 0), or where its rows go home in the source's combox (c = 1), of source "
                 "rank {a} for local expert {b}"),
    3: ("tile", "tile window {c} of local expert {b} to land ({value} of its {expected} chunks landed)"),
    4: ("return", "returned chunk {c} of expert {b} from its owner rank {a}"),
    5: ("command", "the scheduler's command {b} to processor {a}"),
    6: ("tasks", "tasks to hand out (assigned {a} of {b}, published {c})"),
    7: ("bad_count", "source rank {a} announced {value} rows for local expert {b}, over the capacity {expected}"),
    8: ("queue_full", "a task queue slot ({a} needed, capacity {b})"),
    9: ("start", "the kernel of rank {a} to start (launch {expected}; is every rank launching the layer?)"),
    10: ("slice", "the bf16 tile GEMM's slice {c} (TMA: A rows from {a}, weight rows from {b}) to land"),
}


class KernelError(RuntimeError):
    """The kernel stopped on an error it detected (see `record` for the decoded fields)."""

    def __init__(self, record: dict):
        self.record = record
        super().__init__(describe(record))

    def __reduce__(self):
        # a worker process sends its error to the parent pickled: rebuilt from the record, not
        # from the message (the default, which __init__ cannot take)
        return type(self), (self.record,)


class KernelTimeout(KernelError):
    """A bounded wait in the kernel ran out: names the rank, block and what it waited for."""


def decode(words: np.ndarray) -> dict | None:
    """The error record as a dict, or None if the kernel recorded no error."""
    w = [int(v) for v in np.asarray(words, np.int64).reshape(-1)[:ERROR_WORDS]]
    if len(w) != ERROR_WORDS:
        raise ValueError(f"an error record has {ERROR_WORDS} words, got {len(w)}")
    if w[0] == 0:
        return None
    keys = ("flag", "rank", "block", "thread", "what_code", "a", "b", "c", "value", "expected", "waited_ns")
    rec = dict(zip(keys, w))
    rec["what"] = _WHAT.get(rec["what_code"], ("unknown", "unknown wait code {what_code}"))[0]
    return rec


def describe(rec: dict) -> str:
    template = _WHAT.get(rec["what_code"], ("unknown", "unknown wait code {what_code}"))[1]
    what = template.format(**rec)
    if rec["what_code"] in (7, 8):
        return f"rank {rec['rank']} block {rec['block']}: {what}"
    return (f"rank {rec['rank']} block {rec['block']} thread {rec['thread']} timed out after "
            f"{rec['waited_ns'] / 1e6:.1f} ms waiting for {what}")


def raise_if_error(words: np.ndarray) -> None:
    rec = decode(words)
    if rec is None:
        return
    raise (KernelError if rec["what_code"] in (7, 8) else KernelTimeout)(rec)
