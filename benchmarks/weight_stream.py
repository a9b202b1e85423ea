"""Build and run benchmarks/weight_stream.cu: how fast the bf16 tile GEMM's TMA ring streams the
128-expert layer's weight slices with no GEMM, the bound on a task whose slice comes from HBM alone.

    python benchmarks/weight_stream.py --out OUT_DIR --commit SHA [--prefix h200x1-] [--multiply-ns 920]

Writes OUT_DIR/<prefix>weight-stream.json (prefix: the GPU's tag and a dash where not given): GPU,
driver, nvcc, commit, command and date under "meta", the copy engine's read+write rate for scale,
and each variant's time per 1 MiB task; and prints a table. Needs nvcc and an sm_90 GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.calibrate_gpu import driver, gpu_tag  # noqa: E402
from gpu import build  # noqa: E402
from reference.cli import format_table  # noqa: E402

SOURCE = Path(__file__).with_suffix(".cu")
# the 128-expert layer on one GPU: 2048 tasks of a 128-row tile x 256 weight columns x 2048 deep
TASK_FLOPS = 2 * 128 * 256 * 2048


class StreamError(RuntimeError):
    """nvcc or the GPU run failed."""


def compile_binary(nvcc: str, out: Path) -> Path:
    """weight_stream.cu built for sm_90a into `out`; raises StreamError with nvcc's message."""
    done = subprocess.run([nvcc, "-O3", "-std=c++17", *build.arch_flags(build.ARCH), *build.defines({}), "-o",
                           str(out), str(SOURCE)], capture_output=True, text=True)
    if done.returncode:
        raise StreamError(f"nvcc failed on {SOURCE.name}:\n{done.stderr}")
    return out


def run(binary: Path, multiply_ns: int, timeout_s: float = 120.0) -> tuple[dict, list[dict]]:
    """(the run's header, one dict per variant) from the binary's JSON lines."""
    done = subprocess.run([str(binary), str(multiply_ns)], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode:
        raise StreamError(f"{binary.name} exited with {done.returncode}:\n{done.stderr}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(lines) < 2:
        raise StreamError(f"{binary.name} printed no variants:\n{done.stdout}")
    return lines[0], lines[1:]


def table(head: dict, variants: list[dict]) -> str:
    rows = [(("A + " if v["a"] else "") + v["layout"] + " weights" + (f", {v['multiply_ns']} ns sleep a slice"
                                                                       if v["multiply_ns"] else ""),
             f"{v['weight_gbps']:.0f}", f"{v['us_per_task']:.1f}",
             f"{TASK_FLOPS * head['tasks'] / (v['ms'] * 1e9):.0f}") for v in variants]
    return (f"{head['gpu']}, {head['sms']} SMs: copy engine {head['memcpy_read_write_gbps']:.0f} GB/s read + write\n"
            + format_table(["variant", "weight GB/s", "µs per 1 MiB task", "TFLOP/s at best"], rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for <prefix>weight-stream.json")
    ap.add_argument("--commit", default="unknown", help="the repository's commit (the GPU machine's copy has no .git)")
    ap.add_argument("--prefix", default="", help="the file name's start (device_run.sh: the machine, e.g. h200x1-)")
    ap.add_argument("--multiply-ns", type=int, default=920,
                    help="the stand-in for a slice's wgmmas, ns (920: one H200's 29.5 us 128 x 256 task / 32 slices)")
    args = ap.parse_args(argv)
    if args.multiply_ns < 0:
        ap.error(f"--multiply-ns = {args.multiply_ns} is not allowed: 0 or more")
    nvcc = build.nvcc_path()
    if nvcc is None:
        print("weight_stream: nvcc is needed (on PATH or under $CUDA_HOME/bin)", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory() as tmp:
            head, variants = run(compile_binary(nvcc, Path(tmp) / "weight_stream"), args.multiply_ns)
    except (StreamError, subprocess.TimeoutExpired) as e:
        print(f"weight_stream: {e}", file=sys.stderr)
        return 1
    meta = {"gpu": head["gpu"], "driver": driver(), "nvcc": build.nvcc_version(nvcc), "commit": args.commit,
            "command": " ".join(["python3", *sys.argv]), "invoked_by": os.environ.get("MOELAB_COMMAND", ""),
            "date": datetime.date.today().isoformat(),
            "source": "benchmarks/weight_stream.cu", "task_flops": TASK_FLOPS}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.prefix or gpu_tag(head['gpu']) + '-'}weight-stream.json"
    path.write_text(json.dumps({"meta": meta, **head, "variants": variants}, indent=1) + "\n")
    print(table(head, variants))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
