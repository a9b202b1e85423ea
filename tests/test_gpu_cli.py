"""`moelab gpu` as a user runs it (pytest -m gpu; skipped cleanly without a CUDA GPU): one subprocess
per GEMM precision (float32, bf16, tf32, tf32x3) with --check --bench --trace on the tiny preset;
each must exit 0, print the check's table (routing equal, rel. error within its precision's
tolerance, torch layers of its precision timed) and write a trace with the layer's events.
"""

import subprocess
import sys
from pathlib import Path

import cuda_gpus
import pytest

from gpu.cases import GOLDEN_TOLERANCE

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent

# --set changes to the tiny preset per precision: tiles each kernel build supports
PRECISION_SETS = {
    "float32": [],
    "bfloat16": ["precision=bfloat16", "tile_m=64", "tile_n=32", "tile_k=64"],
    "tf32": ["precision=tf32", "tile_m=64"],
    "tf32x3": ["precision=tf32x3", "hidden=128", "ffn=256", "tile_m=64", "tile_n=128", "tile_k=32"],
}
# the torch layer each precision is timed beside first (gpu.cases.PRECISIONS)
OWN_BASELINE = {"float32": "float32", "bfloat16": "bfloat16", "tf32": "tf32", "tf32x3": "float32"}



def _table(stdout: str) -> dict[str, str]:
    """The printed quantity/value table as a dict of strings."""
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and not set(parts[0]) <= {"-"}:
            rows[parts[0]] = parts[-1]
    return rows


@pytest.mark.parametrize("precision", list(PRECISION_SETS))
def test_moelab_gpu_checks_benches_and_traces(precision, tmp_path):
    if cuda_gpus.count() < 1:
        pytest.skip("needs a CUDA GPU")
    trace = tmp_path / "trace.npz"
    cmd = [sys.executable, "-m", "moelab", "gpu", "--config", "tiny", "--gpus", "1", "--check", "--bench",
           "--warmup", "1", "--iters", "3", "--trace", str(trace), "--out", str(tmp_path / "out"), "--quiet"]
    for change in PRECISION_SETS[precision]:
        cmd += ["--set", change]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (precision, done.stdout[-3000:], done.stderr[-3000:])
    table = _table(done.stdout)
    assert table.get("routing_equal") == "True", (precision, done.stdout)
    assert float(table["rel_err"]) < GOLDEN_TOLERANCE[precision], (precision, table["rel_err"])
    assert float(table["kernel_ms"]) > 0 and float(table[f"torch_{OWN_BASELINE[precision]}_ms"]) > 0, table
    assert "failed" not in table
    from sim.trace import Trace

    events = Trace.load(trace)
    assert len(events) > 0 and events.meta["config"]["precision"] == precision
