"""The GPU tests' shared steps: how many CUDA GPUs there are (0 without torch or a CUDA device, so
the tests skip cleanly) and one spawned job of check cases on p of them, with fresh random inputs."""

import os

import pytest


def count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_cases(make_cases, p: int, out_dir, timeout_s: float) -> list[dict]:
    """make_cases(p, seed) on p GPUs (skipped where fewer are there), a fresh seed each run: every
    case's result, in order, none of them failed."""
    if count() < p:
        pytest.skip(f"needs {p} CUDA GPU(s), found {count()}")
    from gpu import spawn

    todo = make_cases(p, int.from_bytes(os.urandom(4), "little"))
    results = spawn.run(todo, p, out_dir, timeout_s=timeout_s)
    assert [r["name"] for r in results] == [c["name"] for c in todo]
    for r in results:
        assert "failed" not in r, r["name"] + ": " + r.get("failed", "")
    return results
