"""The calibration's fits, one module per mechanism: each takes a kernel build's microbenchmark
rows (a section of measurements/calibration-<gpu>.json) and returns a `Fit` of its figures, where
each came from and its (point, measured, model) residuals, within the bound its module states.
`sim.calibrate` runs them in order and writes the calibrated preset.

- `gemm`: the tile GEMM task (matrix rate, fixed cost, weight streaming, row groups, overlap);
- `moves`: copy_rows and puts (the L2 knee, local and NVLink rates, a sender's port share);
- `dispatch`: the store path's dispatch shares, and the dispatch microbenchmark's checks;
- `combine`: the per-tile combine, the final ordered combine and a GEMM1 task's return stores;
- `gate`: the gate phase over tokens, experts and top_k;
- `scheduler`: the hand-off, the idle processors' latencies and the NVLink latency.
"""
