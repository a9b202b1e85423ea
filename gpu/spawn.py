"""Start one worker process per GPU on this host and collect rank 0's results.

Each process gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT (what torchrun sets) and the
NVLink-multicast switches off. The whole job has a wall-clock limit: past it every process is
killed and `SpawnError` is raised, so a host-side hang ends too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class SpawnError(RuntimeError):
    """A worker failed or the job ran past its time limit."""


# what a worker imports (gpu/runtime.py), and the package that brings it
WORKER_MODULES = {"torch": "torch", "cuda.core": "cuda-core", "nvshmem.core": "nvshmem4py-cu13"}


def unmet(gpus: int) -> str | None:
    """Why `gpus` workers cannot run on this host, or None: a module the workers import that is
    not installed, no NVIDIA driver, or fewer GPUs than asked for (CUDA_VISIBLE_DEVICES counts)."""
    for module, package in WORKER_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError as e:  # its parent package is missing, or fails to import
            return f"the GPU workers import {module}, which does not import here ({e}): pip install {package}"
        if not found:
            return (f"the GPU workers import {module}, which is not installed here: pip install {package} "
                    "(the `gpu` extra, README.md)")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA driver here (nvidia-smi not found): `moelab gpu` needs NVIDIA GPUs"
    listed = [line for line in subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.splitlines()
              if line.startswith("GPU ")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    n, counted = len(listed), "nvidia-smi -L"
    if visible is not None:
        n, counted = min(n, len([d for d in visible.split(",") if d.strip()])), "nvidia-smi -L, CUDA_VISIBLE_DEVICES"
    if n < gpus:
        return f"{gpus} GPU(s) asked for, {n} here ({counted})"
    return None


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_start() -> int:
    """The first port of the range the kernel hands out for bind(0) (Linux's default where unreadable)."""
    return int(EPHEMERAL_RANGE.read_text().split()[0]) if EPHEMERAL_RANGE.is_file() else 32768


def free_port(rng: random.Random | None = None) -> int:
    """A free port for rank 0's TCP store, below the kernel's ephemeral range: one the kernel hands
    out for bind(0) and takes back can go to another socket (NCCL's, a finished job's) before rank 0
    binds it again, which failed `moelab gpu` with EADDRINUSE right after the GPU tests (H100s)."""
    high = ephemeral_start()
    low = max(1024, high - 12000)
    rng = rng or random.Random()
    for _ in range(200):
        port = rng.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SpawnError(f"no free TCP port for the workers' rendezvous in {low}..{high - 1}")


def symmetric_heap_bytes(cases: list[dict]) -> int:
    """NVSHMEM heap for the largest case the workers run (not those carrying a `skip` reason), with room
    for NVSHMEM's own use."""
    from reference import Config

    from .layout import Sizes

    need = max((Sizes.of(Config.from_dict(c["config"])).symmetric_bytes for c in cases if not c.get("skip")),
               default=0)
    return int(need * 1.1) + (512 << 20)


def run(cases: list[dict], gpus: int, out_dir: str | Path, timeout_s: float = 600.0, echo: bool = True,
        module: str = "gpu.worker", job_fields: dict | None = None):
    """Run `cases` on `gpus` processes of `python -m module JOB OUT_DIR` (the layer worker, or
    gpu.microbench; `job_fields` go into JOB beside the cases); rank 0's results.json (for the
    worker: one dict per case)."""
    if gpus < 1:
        raise ValueError(f"gpus = {gpus!r} is not allowed: a positive integer")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    job = Path(tempfile.mkstemp(suffix=".json", prefix="moelab-job-")[1])
    job.write_text(json.dumps({"cases": cases, **(job_fields or {})}))
    repo = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, **NO_MULTICAST, "WORLD_SIZE": str(gpus), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "PYTHONUNBUFFERED": "1",
           "NVSHMEM_SYMMETRIC_SIZE": str(symmetric_heap_bytes(cases)),
           "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = []
    for r in range(gpus):
        procs.append(subprocess.Popen([sys.executable, "-m", module, str(job), str(out_dir)],
                                      env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                      stdout=None if (echo and r == 0) else subprocess.DEVNULL,
                                      start_new_session=True))
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise SpawnError(f"the job ran past {timeout_s:.0f} s; its {gpus} processes were killed")
            if any(p.returncode not in (None, 0) for p in procs):
                time.sleep(5)  # let the others report, then stop them
                bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (None, 0)]
                raise SpawnError(f"worker(s) exited with failure: {bad}")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        job.unlink(missing_ok=True)
    results = out_dir / "results.json"
    if not results.is_file():
        raise SpawnError("rank 0 wrote no results.json")
    return json.loads(results.read_text())
