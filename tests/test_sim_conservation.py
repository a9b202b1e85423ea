"""Conservation and determinism: every planned task runs once, the plan's bytes move, no
processor runs two things at once, no signal precedes its data, same inputs give the same bytes."""

import io
from collections import Counter, defaultdict

import numpy as np
import pytest

import reference
import sim
from reference import presets
from reference.plan import TASK_KINDS
from sim.trace import KIND, ROLE

KIND_NAME = {KIND[k]: k for k in TASK_KINDS}
# the paper's node size, P = 8, on one node and on two nodes of 4: the 8-rank paths that the
# withheld 8-GPU machines would run
EIGHT = presets.get("tiny").replace(name="tiny-p8", ranks=8)
CASES = [(presets.get("tiny"), "ibgda"), (presets.get("tiny-deepseek"), "ibgda"),
         *[(presets.get("tiny-nodrop"), t) for t in sim.TRANSPORTS],
         (EIGHT, "ibgda"), (sim.with_nodes(EIGHT, 2), "ibrc")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0].name}-{c[0].nodes}n-{c[1]}")
def run(request):
    cfg, transport = request.param
    plan = reference.plan_of(cfg)
    return cfg, plan, sim.simulate(cfg, transport=transport, plan=plan).trace


def test_every_task_of_the_plan_runs_exactly_once_on_its_rank(run):
    cfg, plan, trace = run
    tasks = trace.select((trace["role"] == ROLE["processor"])
                         & np.isin(trace["kind"], [KIND[k] for k in TASK_KINDS]))
    ran = Counter(zip(tasks["tile"].tolist(), [TASK_KINDS.index(KIND_NAME[k]) for k in tasks["kind"]],
                      tasks["rank"].tolist()))
    planned = Counter(zip(plan.task_tile.tolist(), plan.task_kind.tolist(), plan.task_rank.tolist()))
    assert ran == planned


def test_bytes_in_the_trace_are_the_bytes_of_the_plan(run):
    cfg, plan, trace = run
    moved = sim.metrics.compute(trace, cfg)["bytes"]
    s = plan.summary()
    assert moved == {"local": s["bytes_local"], "nvlink": s["bytes_nvlink"], "network": s["bytes_network"]}


def test_no_processor_runs_two_things_at_once(run):
    _, _, trace = run
    proc = trace.where("processor")
    for rank in np.unique(proc["rank"]):
        for lane in np.unique(proc["lane"][proc["rank"] == rank]):
            sel = (proc["rank"] == rank) & (proc["lane"] == lane)
            order = np.argsort(proc["start"][sel], kind="stable")
            s, e = proc["start"][sel][order], proc["end"][sel][order]
            assert (s[1:] >= e[:-1]).all() and (e >= s).all()


def test_signals_never_precede_their_data(run):
    _, plan, trace = run
    puts = trace.select((trace["kind"] == KIND["put"]) & np.isin(trace["role"], [ROLE["link"], ROLE["nic"]]))
    subs = trace.where("subscriber")
    # each chunk is signalled at its owner (a shared expert's is not dispatched) and back home
    assert len(subs) == plan.transfer_kind.size
    landed, seen = defaultdict(list), defaultdict(list)
    for t, s, d, e in zip(puts["tile"], puts["rank"], puts["peer"], puts["end"]):
        landed[int(t), int(s), int(d)].append(float(e))
    for t, r, src, start in zip(subs["tile"], subs["rank"], subs["peer"], subs["start"]):
        seen[int(t), int(src), int(r)].append(float(start))
    assert landed.keys() == seen.keys()
    for key, ends in landed.items():  # a local tile goes out and back on one key: pair in time order
        assert all(e <= s for e, s in zip(sorted(ends), sorted(seen[key]))), key


def test_dispatch_is_signalled_at_the_owner_and_the_return_at_the_source(run):
    _, plan, trace = run
    subs = trace.where("subscriber")
    expect = Counter(zip(plan.transfer_tile.tolist(), plan.transfer_dst.tolist()))
    assert Counter(zip(subs["tile"].tolist(), subs["rank"].tolist())) == expect


def _npz_bytes(trace) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **trace.columns)
    return buf.getvalue()


@pytest.mark.parametrize("baseline", [False, True])
@pytest.mark.parametrize("name", ["tiny-nodrop", "tiny-deepseek"])  # tiles of one source; of several
def test_same_inputs_same_trace_bytes(tmp_path, baseline, name):
    cfg = sim.with_nodes(presets.get(name), 2)
    a = sim.simulate(cfg, transport="decoupled", baseline=baseline).trace
    b = sim.simulate(cfg, transport="decoupled", baseline=baseline).trace
    a.save(tmp_path / "a.npz")
    b.save(tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    assert _npz_bytes(a) == _npz_bytes(b)


def test_baseline_moves_padded_blocks_and_runs_its_kernels_on_every_sm():
    cfg = presets.get("tiny-nodrop")
    r = sim.simulate(cfg, baseline=True)
    pad = cfg.capacity if cfg.capacity is not None else int(reference.plan_of(cfg).send_counts[:, :cfg.experts].max())
    block = cfg.local_experts * pad * cfg.hidden * cfg.dtype_bytes
    b = r.metrics["bytes"]
    assert b["local"] + b["nvlink"] + b["network"] == 2 * cfg.ranks * cfg.ranks * block
    gemm0 = r.trace.where("processor", "gemm0")
    assert len(gemm0) == cfg.ranks * sim.hardware.get("h100-sxm").sms
    assert r.metrics["fences"]["total"] == 0 and r.metrics["signals"] == 0
