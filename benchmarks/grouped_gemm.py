"""The rate the fastest grouped GEMM a user would pick (torch._grouped_mm, bf16) reaches on a layer's
own expert GEMMs, beside the dense matmul ceiling the roofline is quoted at: what a layer's GEMM
phase can hope for at its shapes. Each zoo layer's routed experts on one GPU (its shared experts
left out), every expert given the rows
the layer routes it on average (tokens x k / experts), GEMM0 (H -> 2I gated, or I) and GEMM1
(I -> H) timed alone (CUDA events, the median of the launches), each weight layout torch takes
((E, K, N) and its N-major transpose: the faster is kept). Prints one row per layer; --json writes
them with the GPU, driver, commit and command. On the GPU machine:
    python benchmarks/grouped_gemm.py --tokens 4096 --json measurements/gpu/h200x1-grouped-gemm-COMMIT.json"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import ceiling_tflops, median_seconds  # noqa: E402

from gpu.provenance import run_meta  # noqa: E402
from reference import presets  # noqa: E402
from reference.cli import format_table  # noqa: E402
from reference.weights import ffn_in_width  # noqa: E402


def grouped_seconds(experts: int, rows: int, k: int, n: int) -> tuple[float, str]:
    """The faster of torch._grouped_mm's two weight layouts on `experts` blocks of `rows` x `k` rows
    times k x n weights, and which it was."""
    import torch

    a = torch.randn(experts * rows, k, device="cuda", dtype=torch.bfloat16)
    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * rows
    best = None
    for layout in ("k-major", "n-major"):
        w = torch.randn(experts, k, n, device="cuda", dtype=torch.bfloat16) if layout == "k-major" else \
            torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
        s = median_seconds(partial(torch._grouped_mm, a, w, offs=offs))
        if best is None or s < best[0]:
            best = (s, layout)
        del w
    del a
    torch.cuda.empty_cache()
    return best


def layer_row(name: str, tokens: int, ceiling: float) -> dict:
    cfg = presets.get(name)
    rows = max(1, round(tokens * cfg.top_k / cfg.experts))
    out = {"layer": name, "tokens": tokens, "experts": cfg.experts, "rows_per_expert": rows}
    total_flops = total_s = 0.0
    for gemm, (k, n) in (("gemm0", (cfg.hidden, ffn_in_width(cfg))), ("gemm1", (cfg.ffn, cfg.hidden))):
        s, layout = grouped_seconds(cfg.experts, rows, k, n)
        flops = 2.0 * cfg.experts * rows * k * n
        out[f"{gemm}_ms"], out[f"{gemm}_layout"] = s * 1e3, layout
        out[f"{gemm}_share_of_ceiling"] = flops / s / 1e12 / ceiling
        total_flops, total_s = total_flops + flops, total_s + s
    out["both_ms"] = total_s * 1e3
    out["both_share_of_ceiling"] = total_flops / total_s / 1e12 / ceiling
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096, help="tokens per GPU (default 4096)")
    p.add_argument("--layers", nargs="+", default=list(presets.ZOO), help="zoo presets (default: the zoo)")
    p.add_argument("--json", metavar="FILE", help="also write the rows and the run's provenance here")
    args = p.parse_args(argv)
    if args.tokens < 1:
        p.error(f"--tokens {args.tokens}: at least 1")
    for name in args.layers:
        if name not in presets.ZOO:  # before the GPU work
            p.error(f"--layers {name!r} is not allowed: one of {', '.join(presets.ZOO)}")
    ceiling = ceiling_tflops("bfloat16")
    rows = []
    for name in args.layers:
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(layer_row(name, args.tokens, ceiling))
    print(f"bf16 matmul ceiling (8192^3): {ceiling:.1f} TFLOP/s")
    pct = lambda x: f"{100 * x:.1f}"  # noqa: E731
    print(format_table(("layer", "rows/expert", "GEMM0 ms", "% ceil", "GEMM1 ms", "% ceil", "both % ceil"),
                       [(r["layer"], r["rows_per_expert"], f"{r['gemm0_ms']:.3f}", pct(r["gemm0_share_of_ceiling"]),
                         f"{r['gemm1_ms']:.3f}", pct(r["gemm1_share_of_ceiling"]), pct(r["both_share_of_ceiling"]))
                        for r in rows]))
    if args.json:
        meta = {**run_meta(" ".join(["python", "benchmarks/grouped_gemm.py", *sys.argv[1:]])),
                "bf16_ceiling_tflops": ceiling}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
