"""The config form in the sidebar: a preset, the editable fields, and validation next to a field.

Widgets hold their values under `<form>.<field>` keys in the session state: the Simulate and
Golden pages share the form "cfg"; the Fences page has its own, starting from a multi-node
config. `reference.Config` is the only validator: its `ConfigError` names the field, and the
message is shown under that field's widget (or above the form when no widget shows it).
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from reference import Config, ConfigError, budget, presets
from reference.budget import BudgetError
from reference.config import PRECISIONS

DEFAULT_PRESET = "small"  # simulates in about a second: the app must be fast to start
DEFAULT_HARDWARE, DEFAULT_TRANSPORT = "h100-sxm", "ibgda"  # sim.simulate's defaults
# (field, label, help); integer fields first, in the order a reader meets them
INT_FIELDS = (
    ("tokens", "tokens per GPU (T)", "tokens that live on each GPU before routing"),
    ("experts", "experts (E)", "routed experts, spread evenly over the GPUs"),
    ("top_k", "top-k (k)", "experts each token is sent to"),
    ("hidden", "model dim (H)", "width of a token"),
    ("ffn", "expert FFN dim (I)", "inner width of each expert's FFN"),
    ("ranks", "GPUs", "GPUs holding experts, one process each"),
    ("gpus_per_node", "GPUs per node", "GPUs joined by NVLink; more GPUs than this span nodes"),
    ("tile_m", "tile rows (bM)", "token rows per tile"),
    ("tile_n", "tile columns (bN)", "output columns per GEMM task"),
    ("tile_k", "tile depth (bK)", "reduction depth per step inside a task"),
)
FORMS = ("cfg", "fences", "sim")  # key prefixes of the widgets whose values outlive a page
# what each GEMM precision (Config.precision) multiplies, as the form's choice shows it
PRECISION_LABELS = {"float32": "float32 FMAs", "tf32": "tf32 (float32 data, 10-bit operands)",
                    "tf32x3": "tf32x3 (float32 data and accuracy)", "bfloat16": "bfloat16"}


KERNEL_QUEUE = "as the kernel build"  # the queue choice that leaves it to sim.costs.queue_policy
KERNEL_DISPATCH = "as the kernel"  # the dispatch choice that leaves it to sim.costs.dispatch_path


@dataclass(frozen=True)
class SimOptions:
    hardware: str
    transport: str
    baseline: bool
    queue: str | None  # sim.costs.QUEUE_POLICIES, or None: as the config's kernel build queues
    dispatch: str | None  # sim.trace.DISPATCH_PATHS; None: as the kernel does (sim.costs.dispatch_path)
    staged_blocks: int  # the staged dispatch's senders


def keep_state() -> None:
    """Keep the form's values while a page without the form is shown (Streamlit drops the state
    of widgets that a run does not draw, unless the script writes it back)."""
    for k in list(st.session_state):
        if isinstance(k, str) and k.split(".")[0] in FORMS:
            st.session_state[k] = st.session_state[k]


def _load_preset(form: str) -> None:
    cfg = presets.get(st.session_state[f"{form}.preset"])
    for f, _, _ in INT_FIELDS:
        st.session_state[f"{form}.{f}"] = getattr(cfg, f)
    st.session_state[f"{form}.precision"] = cfg.precision
    st.session_state[f"{form}.drop"] = cfg.capacity_factor is not None
    st.session_state[f"{form}.capacity_factor"] = float(cfg.capacity_factor or 1.0)


def config_sidebar(form: str = "cfg", preset: str = DEFAULT_PRESET, sim_options: bool = False,
                   job: str = "route") -> tuple[Config | None, SimOptions | None]:
    """Draw the form `form` (starting from `preset`); the config it holds (None, with the error
    shown, when it is not valid or too large for the page's `job`, reference.budget.JOBS), and
    the simulator's options when `sim_options`."""
    if f"{form}.preset" not in st.session_state:
        st.session_state[f"{form}.preset"] = preset
        _load_preset(form)
    bar = st.sidebar
    bar.selectbox("preset", list(presets.PRESETS), key=f"{form}.preset", on_change=_load_preset,
                  args=(form,), help="the papers' configurations and small ones; edit the fields below")
    slots = {}
    left, right = bar.columns(2)
    for i, (f, label, help_) in enumerate(INT_FIELDS):
        col = left if i % 2 == 0 else right
        col.number_input(label, key=f"{form}.{f}", step=1, help=help_)
        slots[f] = col.empty()
    bar.caption(_nodes_caption(form))
    bar.selectbox("precision", PRECISIONS, key=f"{form}.precision", format_func=PRECISION_LABELS.get,
                  help="how the expert GEMMs multiply: float32 FMAs on CUDA cores; float32 data on TF32 tensor "
                       "cores (operands rounded to 10 mantissa bits); float32 data on TF32 tensor cores with each "
                       "operand split in two and three products per pair (float32's accuracy, the tf32x3 "
                       "kernel); or bfloat16 data and tensor cores")
    slots["precision"] = bar.empty()
    bar.checkbox("drop tokens over capacity", key=f"{form}.drop",
                 help="each GPU may send at most capacity factor x T x k / E rows to an expert")
    bar.number_input("capacity factor", key=f"{form}.capacity_factor", step=0.25, format="%.2f",
                     disabled=not st.session_state[f"{form}.drop"])
    slots["capacity_factor"] = bar.empty()
    options = None
    if sim_options:
        from sim import TRANSPORTS, costs, hardware  # the simulator only where its options are shown
        from sim.trace import DISPATCH_PATHS

        st.session_state.setdefault("sim.hardware", DEFAULT_HARDWARE)
        st.session_state.setdefault("sim.transport", DEFAULT_TRANSPORT)
        st.session_state.setdefault("sim.baseline", False)
        st.session_state.setdefault("sim.queue", KERNEL_QUEUE)
        st.session_state.setdefault("sim.dispatch", KERNEL_DISPATCH)
        st.session_state.setdefault("sim.staged_blocks", costs.STAGED_BLOCKS)
        bar.selectbox("hardware", list(hardware.PRESETS), key="sim.hardware")
        bar.selectbox("transport", list(TRANSPORTS), key="sim.transport",
                      help="how inter-node tiles move: proxy-based IBRC with per-tile fences, "
                           "Perseus' fixes, or GPU-initiated IBGDA")
        bar.checkbox("bulk-synchronous baseline", key="sim.baseline",
                     help="separate kernels and all-to-all collectives instead of one kernel")
        bar.selectbox("queue", [KERNEL_QUEUE, *costs.QUEUE_POLICIES], key="sim.queue",
                      help="when a landed tile's GEMM0 tasks are queued: with the rest of its expert's tiles once "
                           "the last has landed (expert: the bf16 kernel's rule, its tasks reading each weight "
                           "slice together), or as it lands (tile: the float32 kernel's)")
        bar.selectbox("dispatch", [KERNEL_DISPATCH, *DISPATCH_PATHS], key="sim.dispatch",
                      help="how dispatched rows reach their expert's GPU: staged (a few blocks send the peers' "
                           "chunks one local expert after another, so experts complete in waves), store (every "
                           "block shares every chunk at once), or put (one block packs and puts each chunk); the "
                           f"kernel's: {costs.DEFAULT_DISPATCH}")
        bar.number_input("staged senders", key="sim.staged_blocks", min_value=1, step=1,
                         max_value=hardware.get(st.session_state["sim.hardware"]).processors - 1,
                         disabled=st.session_state["sim.dispatch"] not in ("staged", KERNEL_DISPATCH),
                         help=f"blocks that send the peers' chunks on the staged dispatch (the kernel's: "
                              f"{costs.STAGED_BLOCKS})")
        queue, dispatch = st.session_state["sim.queue"], st.session_state["sim.dispatch"]
        options = SimOptions(st.session_state["sim.hardware"], st.session_state["sim.transport"],
                             st.session_state["sim.baseline"], None if queue == KERNEL_QUEUE else queue,
                             None if dispatch == KERNEL_DISPATCH else dispatch,
                             int(st.session_state["sim.staged_blocks"]))
    try:
        cfg = build_config(form)
        budget.check(cfg, job, flag=None)
        return cfg, options
    except ConfigError as e:
        (slots.get(e.field) or bar).error(str(e))
        st.error(f"The config is not valid: {e}")
        return None, options
    except BudgetError as e:
        st.error(f"The config is too large for the app: {e}")
        return None, options


def build_config(form: str) -> Config:
    """The Config the values of form `form` describe (raises ConfigError)."""
    state = st.session_state
    base = presets.get(state[f"{form}.preset"])
    changes = {f: state[f"{form}.{f}"] for f, _, _ in INT_FIELDS}
    changes["precision"] = state[f"{form}.precision"]
    changes["capacity_factor"] = float(state[f"{form}.capacity_factor"]) if state[f"{form}.drop"] else None
    cfg = Config.from_dict({**base.to_dict(), **changes})
    return cfg if cfg == base else cfg.replace(name=f"{base.name}-edited")


def _nodes_caption(form: str) -> str:
    ranks, per = st.session_state[f"{form}.ranks"], st.session_state[f"{form}.gpus_per_node"]
    if isinstance(ranks, int) and isinstance(per, int) and ranks > 0 and per > 0:
        nodes = -(-ranks // per)
        return f"{ranks} GPU{'s' * (ranks != 1)} on {nodes} node{'s' * (nodes != 1)}"
    return ""
