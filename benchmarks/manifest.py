"""measurements/MANIFEST.json: every file the working tree keeps under measurements/ (path, sha256,
bytes, what it is, the GPU machine and kernel commit that measured it) and the files that left the
tree, each named with the commit whose history still holds it.

    python benchmarks/manifest.py            # rewrite the manifest from the tree
    python benchmarks/manifest.py --check    # exit 1 naming each file the manifest does not match

A new measurement gets a new name (its commit in the name, as the device runs write them), so a
file under a name the manifest lists never changes; `tests/test_measurements_manifest.py` holds it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASUREMENTS = ROOT / "measurements"
MANIFEST = MEASUREMENTS / "MANIFEST.json"
KINDS = (  # (name pattern, what it is), first match wins
    (r"^calibration-", "microbenchmarks of the megakernel's pieces on one GPU host (benchmarks/calibrate_gpu.py)"),
    (r"^calibrated-", "the preset fitted on them (moelab calibrate), what moelab compare predicts with"),
    (r"-trace-.*\.npz$", "kernel telemetry trace of one layer run (the trace schema, sim/trace.py)"),
    (r"-bench-.*\.json$", "benchmark summary: checks, kernel and torch times (benchmarks/bench_gpu.py)"),
    (r"-repeat.*\.json$", "a benchmark repeated side by side with another kernel commit"),
    (r"-experiments-.*\.json$|^experiments-", "a side-by-side experiment (docs/gpu-measurements.md)"),
    (r"-weight-stream\.json$", "the TMA ring's weight stream alone (benchmarks/weight_stream.py)"),
    (r"-microbench-.*\.json$", "raw microbenchmark output of an earlier kernel"),
    (r"-device-log.*\.txt$", "raw log of a device run (benchmarks/device_run.sh)"),
    (r"-pytest.*\.txt$", "raw log of the GPU tests on the device"),
    (r"-ncu-.*\.txt$", "Nsight Compute report"),
)


def what(name: str) -> str:
    return next((text for pattern, text in KINDS if re.search(pattern, name)), "measurement")


def provenance(path: Path) -> tuple[str | None, str | None]:
    """(GPU machine, kernel commit) as the file records them, else as its name says."""
    m = re.match(r"^(h[12]00x\d)-|^calibrat\w+-(h[12]00)\b", path.name)
    gpu = (m[1] or m[2]) if m else None
    commit = None
    try:
        if path.suffix == ".json":
            meta = json.loads(path.read_text()).get("meta", {})
            commit = meta.get("commit") if isinstance(meta, dict) else None
        elif path.suffix == ".npz":
            import numpy as np

            with np.load(path) as f:
                commit = json.loads(str(f["meta"])).get("commit") if "meta" in f.files else None
    except (ValueError, OSError, AttributeError):
        commit = None
    if not commit and (m := re.search(r"-([0-9a-f]{7,40})(?:-|\.)", path.name)):
        commit = m[1]
    return gpu, (str(commit) if commit else None)


def tree_files() -> list[Path]:
    return sorted(p for p in MEASUREMENTS.rglob("*") if p.is_file() and p != MANIFEST)


def entry(path: Path) -> dict:
    gpu, commit = provenance(path)
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "bytes": path.stat().st_size,
            "what": what(path.name), "gpu": gpu, "commit": commit}


def build(left: dict[str, str]) -> dict:
    return {"kept": {str(p.relative_to(ROOT)): entry(p) for p in tree_files()}, "left_the_tree": left}


def mismatches(doc: dict) -> list[str]:
    """Each way the tree differs from the manifest, named."""
    kept = doc.get("kept", {})
    tree = {str(p.relative_to(ROOT)): p for p in tree_files()}
    out = [f"{name}: in the tree, not in the manifest" for name in sorted(set(tree) - set(kept))]
    out += [f"{name}: in the manifest, not in the tree" for name in sorted(set(kept) - set(tree))]
    for name in sorted(set(tree) & set(kept)):
        if hashlib.sha256(tree[name].read_bytes()).hexdigest() != kept[name]["sha256"]:
            out.append(f"{name}: changed since the manifest (a new result takes a new name)")
    left = set(doc.get("left_the_tree", {}))
    out += [f"{name}: listed as left, but in the tree" for name in sorted(left & set(tree))]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare the tree with the manifest, change nothing")
    args = ap.parse_args()
    old = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    if args.check:
        bad = mismatches(old)
        for line in bad:
            print(line, file=sys.stderr)
        return 1 if bad else 0
    MANIFEST.write_text(json.dumps(build(old.get("left_the_tree", {})), indent=0, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
