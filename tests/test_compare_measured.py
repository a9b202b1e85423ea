"""Loop 4: every committed measured layer run (measurements/gpu/) against the simulator with the
preset calibrated on that GPU's microbenchmarks (never on the layer runs): latency within 10%,
each phase's busy time within 20%, overlap efficiency within 0.1 absolute. A miss is a finding
about the model: improve the model, never these bounds. Float32 and bf16 runs alike: a run whose
dtype or tile shape the committed calibration has not measured is skipped, saying which."""

import dataclasses
import json

import pytest

from moelab.cli import main
from sim import compare
from sim.trace import Trace

RUNS = compare.measured_runs()
EVERY_RUN = compare.measured_runs(calibrated_only=False)
PREDICT = compare.Predictor()  # partners' predictions are shared between runs
# (run, quantity) misses of the calibrations committed in measurements/calibration-<gpu>.json, each
# with its cause (docs/validation.md). Strict: a miss that starts to hold must leave this list.
# Measured at 3e55a17 on 2 H200s and at 1c965a1 (the kernel before its two-slot mailbox) on 1 H100.
SMALL_LAYER = ("at 1K-2K tokens per GPU the layer's ~32-64-row tile tasks take longer in the layer than in the "
               "isolated microbenchmark (H200 bf16 at 1K tokens: GEMM0 busy time 23-25% over the prediction): "
               "the layer is underpredicted by 11-25%")
TWO_SLOT_TAIL = ("not yet told apart, just past the bound (-10.4% and -10.6%): one candidate is the two-slot "
                 "mailbox, which gives a busy processor its next task in processor order while the model gives "
                 "every task to the earliest free processor, so a phase's last tasks can wait behind a running "
                 "one while another processor idles")
H100_CONTENTION = ("on the H100 the bf16 GEMM microbenchmark, 264 tasks started at once, times a 128-row task at "
                   "50-56 us, the layer's staggered tasks take 39-48 us (less HBM: its calibration charges every "
                   "task the moment all blocks load at once): GEMM phases overpredicted by 23-34% at 8-32 "
                   "experts and at 16K tokens, the layer by 11-16%")
COMBINE_ONE_SIZE = ("the final ordered combine's cost per byte is calibrated at one size (8192 tokens); on the H100 "
                    "it costs less per byte at 1K-2K tokens (combine overpredicted by 20-23%) and more at 16K "
                    "(underpredicted by 20%)")
KNOWN_MISSES: dict[tuple[str, str], str] = {
    **{(f"h200x2-trace-flashmoe-{p}", "layer"): SMALL_LAYER
       for p in ("tokens-1k-bf16-p1", "tokens-1k-bf16-p2", "tokens-2k-bf16-p1", "tokens-2k-bf16-p2",
                 "tokens-1k-p1", "tokens-1k-p2")},
    **{(f"h200x2-trace-flashmoe-{p}", "gemm0"): SMALL_LAYER for p in ("tokens-1k-bf16-p1", "tokens-1k-bf16-p2")},
    **{(f"h200x2-trace-flashmoe-{p}", "layer"): TWO_SLOT_TAIL for p in ("tokens-4k-bf16-p1", "experts-128-bf16-p2")},
    **{(f"h100x1-trace-flashmoe-{p}", "layer"): SMALL_LAYER
       for p in ("tokens-1k-bf16-p1", "tokens-1k-p1", "tokens-2k-bf16-p1", "tokens-2k-p1")},
    **{(f"h100x1-trace-flashmoe-{p}", q): H100_CONTENTION
       for p in ("experts-8-bf16-p1", "experts-16-bf16-p1", "experts-32-bf16-p1", "tokens-16k-bf16-p1")
       for q in ("layer", "gemm0", "gemm1")},
    **{(f"h100x1-trace-flashmoe-{p}", "combine"): COMBINE_ONE_SIZE for p in ("tokens-2k-bf16-p1", "tokens-16k-p1")},
}


def test_there_are_measured_runs():
    assert RUNS, "no measured run under measurements/gpu/"


def test_each_run_is_predicted_on_its_kernels_dispatch_path():
    """Traces say how their kernel dispatched since it stores rows; the ones before put every tile."""
    old = next(r for r in RUNS if "dispatch" not in r.trace.meta)
    new = dataclasses.replace(old, trace=Trace(old.trace.columns, {**old.trace.meta, "dispatch": "store"}))
    assert (old.dispatch, new.dispatch) == ("put", "store")
    for run in (old, new):
        assert compare.compare(run, predict=PREDICT).predicted.meta["dispatch"] == run.dispatch


@pytest.mark.parametrize("run", EVERY_RUN, ids=[r.name for r in EVERY_RUN])
def test_prediction_within_bounds(run):
    reason = compare.uncovered(run)
    if reason:
        pytest.skip(f"not calibrated: {reason}")
    if run.commit is None:
        pytest.skip("the run recorded no commit: its kernel cannot be matched to the calibrated one")
    c = compare.compare(run, runs=RUNS, predict=PREDICT)
    misses = {r[0].split(" ")[0] for r in c.rows if r[5] is False}
    known = {q for r, q in KNOWN_MISSES if r == run.name}
    assert misses - known == set(), compare.table(c)
    assert known - misses == set(), f"{sorted(known - misses)} now hold: remove them from KNOWN_MISSES"
    if known:
        pytest.xfail("; ".join(KNOWN_MISSES[run.name, q] for q in sorted(known)))


def test_cli_writes_both_timelines(tmp_path, capsys):
    run = RUNS[0]
    trace, png = tmp_path / "both.json", tmp_path / "both.png"
    assert main(["compare", "--measured", str(run.path), "--trace", str(trace), "--png", str(png), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "layer latency (ms)" in out and "gemm0 busy" in out
    names = [e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["name"] == "process_name"]
    assert names[: run.config.ranks] == [f"measured GPU {r}" for r in range(run.config.ranks)]
    assert "predicted GPU 0" in names
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_each_panel_counts_its_own_processors():
    """A preset of another block count (h100-sxm: 4 per SM, the H100 run: 2) must not push the
    predicted 'SMs busy' past 1 into the link strips above it."""
    run = next(r for r in RUNS if r.gpu_tag == "h100")
    c = compare.compare(run, "h100-sxm", predict=PREDICT)
    assert c.hardware.processors > run.processors
    fig = compare.figure(c)
    for ax in fig.axes[: 2 * run.config.ranks]:
        busy = [p for p in ax.collections if p.get_label() in compare.PHASES]
        assert busy, ax.get_ylabel()
        top = max(path.vertices[:, 1].max() for p in busy for path in p.get_paths())
        assert 0.5 < top <= 1.0 + 1e-9, (ax.get_ylabel(), top)


def test_cli_rejects_a_file_that_is_not_a_measured_run(tmp_path, capsys):
    bad = tmp_path / "x.npz"
    bad.write_bytes(b"not a trace")
    assert main(["compare", "--measured", str(bad)]) == 2
    assert "compare option 'measured'" in capsys.readouterr().err


def test_validation_doc_is_current():
    from pathlib import Path

    from sim import validation

    doc = Path(__file__).resolve().parent.parent / "docs" / "validation.md"
    comparisons = [compare.compare(r, runs=RUNS, predict=PREDICT) for r in RUNS]
    assert validation.markdown(comparisons) == doc.read_text(), \
        "docs/validation.md is stale: moelab compare --all --markdown docs/validation.md"
