"""gpu/spawn.py: the rendezvous port (free, outside the range the kernel hands out to other sockets), and
what a host lacks to run the GPU workers, said before any is spawned (by `moelab gpu` and the
benchmark)."""

import random
import socket

import pytest

from gpu import spawn


def test_the_port_is_below_the_ephemeral_range_and_bindable():
    low = spawn.ephemeral_start()
    for _ in range(20):
        port = spawn.free_port()
        assert port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_another_socket_holds_is_passed_over():
    seed = random.randrange(2 ** 32)
    first = spawn.free_port(random.Random(seed))
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        assert spawn.free_port(random.Random(seed)) != first


class _Listed:
    def __init__(self, n):
        self.stdout = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\n" for i in range(n))


def _host(monkeypatch, missing=(), gpus=2, driver=True, visible=None):
    """A made-up host: modules `missing` not installed, `gpus` listed by nvidia-smi (none without a driver)."""
    monkeypatch.setattr(spawn.importlib.util, "find_spec", lambda m: None if m in missing else object())
    monkeypatch.setattr(spawn.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if driver else None)
    monkeypatch.setattr(spawn.subprocess, "run", lambda *a, **k: _Listed(gpus))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


def test_a_missing_worker_module_is_named_with_its_package(monkeypatch):
    _host(monkeypatch, missing=("nvshmem.core",))
    why = spawn.unmet(1)
    assert "nvshmem.core" in why and "pip install nvshmem4py-cu13" in why


def test_a_worker_module_that_fails_to_import_is_named_with_the_error(monkeypatch):
    _host(monkeypatch)

    def broken(module):
        raise ImportError("libnvshmem_host.so.3: cannot open shared object file")

    monkeypatch.setattr(spawn.importlib.util, "find_spec", broken)
    why = spawn.unmet(1)
    assert why.startswith("the GPU workers import torch, which does not import here (libnvshmem_host.so.3")


def test_the_gpus_asked_for_are_counted(monkeypatch):
    _host(monkeypatch, gpus=2)
    assert spawn.unmet(2) is None
    assert spawn.unmet(4) == "4 GPU(s) asked for, 2 here (nvidia-smi -L)"
    _host(monkeypatch, gpus=2, visible="1")
    assert spawn.unmet(2) == "2 GPU(s) asked for, 1 here (nvidia-smi -L, CUDA_VISIBLE_DEVICES)"
    _host(monkeypatch, gpus=2, visible="")
    assert spawn.unmet(1) == "1 GPU(s) asked for, 0 here (nvidia-smi -L, CUDA_VISIBLE_DEVICES)"
    _host(monkeypatch, driver=False)
    assert "no NVIDIA driver" in spawn.unmet(1)


def test_moelab_gpu_says_why_it_cannot_run_instead_of_spawning(monkeypatch, capsys):
    from moelab.cli import main

    monkeypatch.setattr(spawn, "unmet", lambda gpus: f"{gpus} GPU(s) asked for, 0 here (nvidia-smi -L)")
    monkeypatch.setattr(spawn, "run", lambda *a, **k: pytest.fail("spawned the workers"))
    assert main(["gpu", "--config", "tiny", "--gpus", "2", "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == "moelab gpu: error: 2 GPU(s) asked for, 0 here (nvidia-smi -L)"


def test_the_benchmark_says_why_it_cannot_run_for_its_most_gpus(monkeypatch, capsys):
    """benchmarks/bench_gpu.py checks the host for its largest GPU count before it times anything."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_gpu

    asked = []
    monkeypatch.setattr(spawn, "unmet", lambda gpus: asked.append(gpus) or f"{gpus} GPU(s) asked for, 1 here")
    monkeypatch.setattr(bench_gpu, "ceiling_tflops", lambda dt: pytest.fail("timed a ceiling"))
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py", "--gpus", "1", "4", "2", "--suite", "bench"])
    with pytest.raises(SystemExit) as e:
        bench_gpu.main()
    assert e.value.code == 2 and asked == [4]
    assert capsys.readouterr().err.strip().endswith("bench_gpu.py: error: 4 GPU(s) asked for, 1 here")
