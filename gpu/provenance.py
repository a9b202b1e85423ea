"""Where and from what a GPU run's numbers come: the kernel commit, the command, the GPUs, the
driver and the versions, recorded in the meta of every benchmark summary and trace the GPU
commands write (`moelab gpu`, benchmarks/bench_gpu.py), so a committed run names its kernel."""

from __future__ import annotations

import os
import subprocess


def command_output(cmd: list[str]) -> str:
    """A tool's stdout, stripped; "" where it fails or this machine lacks it."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def run_meta(args_line: str) -> dict:
    """The run's provenance: commit (MOELAB_COMMIT where the tree has no .git, as on the GPU
    machines), command, the script that invoked it (MOELAB_COMMAND), GPUs, driver, versions."""
    import torch

    out = command_output  # a tool missing on this machine leaves its field empty
    smi = out(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]).splitlines()
    commit = os.environ.get("MOELAB_COMMIT") or out(["git", "rev-parse", "HEAD"]) or "unknown"
    try:
        from importlib.metadata import version

        nvshmem = version("nvidia-nvshmem-cu13")
    except Exception:  # recorded as unknown rather than failing the run
        nvshmem = "unknown"
    return {"commit": commit, "command": args_line, "invoked_by": os.environ.get("MOELAB_COMMAND", ""),
            "gpus_seen": [line.split(",")[0].strip() for line in smi],
            "driver": smi[0].split(",")[1].strip() if smi else "unknown",
            "torch": torch.__version__, "cuda": torch.version.cuda, "nvshmem": nvshmem,
            "nvcc": (out(["nvcc", "--version"]).splitlines() or ["unknown"])[-1]}
