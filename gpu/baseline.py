"""The same MoE layer in plain torch, the yardsticks the kernel is timed against.

Two layers share one routing and one expert FFN (`TorchMoE`):
- `DroplessLayer`, the one speedups are quoted against (Megatron-Core's all-to-all dispatcher):
  token copies sorted by expert, the counts exchanged and read by the host once, `all_to_all_single`
  with the exact split sizes, the received rows regrouped expert by expert, the experts through one
  grouped GEMM per matrix (`torch._grouped_mm`, or one matmul per expert: `gemm="loop"`), the rows
  sent back with the reversed splits and combined in choice order. Nothing is padded; a config with
  a capacity factor still drops what the golden drops.
- `TorchLayer`, the capacity-padded one: every (source rank, expert) block padded to C slots (T
  rows with no capacity factor), one all_to_all_single each way, batched GEMMs (torch.bmm).
Routing is the golden's rule (reference/routing.py) computed in float64 on the device: every gate,
router bias, group-limited top-k, routed scaling, and the token scaled before its expert. Experts
are the config's activation (gated ones with W1 = [gate | up]), biases, and shared experts (weight
1, after the routed choices). Precisions: float32 (no TF32), tf32 (cuBLAS may use TF32 tensor cores
for the expert GEMMs) or bfloat16 operands, float32 combine. One process per GPU, NCCL (gloo on
the CPU) for the all-to-alls; without an initialized process group, one rank alone.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from reference import Config, weights
from reference.numerics import OAI_ALPHA

from .runtime import logit_offset

PRECISIONS = ("float32", "tf32", "bfloat16")
GEMMS = ("grouped", "loop")


def activation(cfg: Config):
    """The expert activation as a torch function of GEMM0's output (gated: [gate | up] halves)."""
    import torch
    import torch.nn.functional as F

    limit = cfg.swiglu_limit

    def swiglu(h):
        g, u = h.chunk(2, dim=-1)
        return F.silu(g) * u

    def swiglu_oai(h):
        g, u = h.chunk(2, dim=-1)
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
        return (u + 1) * g * torch.sigmoid(OAI_ALPHA * g)

    return {"relu": torch.relu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "gelu": F.gelu,
            "silu": F.silu, "swiglu": swiglu, "swiglu_oai": swiglu_oai}[cfg.activation]


def shared_experts(cfg: Config, device) -> tuple | None:
    """The reference's shared experts (S, ...) as float32 tensors on `device` (None without any):
    every rank holds them all."""
    import torch

    if not cfg.shared_experts:
        return None
    parts = [weights.expert(cfg, cfg.experts + s) for s in range(cfg.shared_experts)]
    return tuple(torch.from_numpy(np.stack([p[i] for p in parts])).to(device) for i in range(4))


def reference_inputs(cfg: Config, rank: int, device="cpu"):
    """The reference's seeded inputs of `rank` on any device, as gpu.runtime.Inputs names them, and
    the gate's logit bias as wg_bias (float32; the layers cast them to their precision)."""
    import torch

    wg, gate_bias = weights.gate(cfg)
    mine = [weights.expert(cfg, e) for e in range(rank * cfg.local_experts, (rank + 1) * cfg.local_experts)]

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    return SimpleNamespace(x=t(weights.tokens(cfg, rank)), wg=t(wg), logit_offset=t(logit_offset(cfg)),
                           gate_bias=t(gate_bias.astype(np.float64)), wg_bias=t(weights.router_bias(cfg)),
                           **{n: t(np.stack([ex[i] for ex in mine])) for i, n in enumerate(("w1", "b1", "w2", "b2"))})


def random_inputs(cfg: Config, rank: int, seed: int, device):
    """Inputs of any layer drawn on `device` at the reference's scales (for sizes the CPU draws
    slowly; the kernel's own are gpu.runtime.Inputs.random): reference_inputs' fields and the shared
    experts (S, ...) as `shared`, float32."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + rank)
    gate = torch.Generator(device=device)
    gate.manual_seed(seed)  # the gate is the same on every rank
    h, i, n_in, e = cfg.hidden, cfg.ffn, weights.ffn_in_width(cfg), cfg.experts

    def normal(shape, scale, gen=g):
        return torch.randn(shape, generator=gen, device=device) * scale

    def bias(shape):
        return normal(shape, 0.1) if cfg.bias else torch.zeros(shape, device=device)

    def experts(n):
        return normal((n, h, n_in), h ** -0.5), bias((n, n_in)), normal((n, i, h), i ** -0.5), bias((n, h))

    w1, b1, w2, b2 = experts(cfg.local_experts)
    return SimpleNamespace(x=normal((cfg.tokens, h), 1.0), wg=normal((h, e), h ** -0.5, gate),
                           logit_offset=torch.from_numpy(logit_offset(cfg)).to(device),
                           gate_bias=normal((e,), 0.1, gate).double(),
                           wg_bias=normal((e,), 0.1, gate) if cfg.router_bias else torch.zeros(e, device=device),
                           w1=w1, b1=b1, w2=w2, b2=b2,
                           shared=experts(cfg.shared_experts) if cfg.shared_experts else None)


class Experts:
    """Expert FFNs act(a W1 + b1) W2 + b2 of stacked weights (G, H, I'), (G, I'), (G, I, H), (G, H)."""

    def __init__(self, cfg: Config, w1, b1, w2, b2):
        self.w1, self.b1, self.w2, self.b2 = w1, b1, w2, b2
        self.bias, self.act = cfg.bias, activation(cfg)

    def batched(self, a):
        """(G, M, H) rows, M per expert (padded blocks): torch.bmm per GEMM."""
        import torch

        h = self.act(self._bias(self.b1[:, None, :], torch.bmm(a, self.w1)))
        return self._bias(self.b2[:, None, :], torch.bmm(h, self.w2))

    def grouped(self, a, counts, counts_host: list[int], gemm: str):
        """(M, H) rows sorted by expert, counts_host[g] of expert g (`counts` the same on the device):
        one grouped GEMM per matrix (gemm "grouped") or one matmul per expert ("loop")."""
        import torch

        m = a.shape[0]

        def mm(a, w):
            if gemm == "grouped":
                return torch._grouped_mm(a, w, offs=torch.cumsum(counts, 0, dtype=torch.int32))
            out = a.new_empty(m, w.shape[-1])
            lo = 0
            for g, n in enumerate(counts_host):
                if n:
                    torch.mm(a[lo: lo + n], w[g], out=out[lo: lo + n])
                lo += n
            return out

        def rows_bias(b):
            return torch.repeat_interleave(b, counts, dim=0, output_size=m)

        h = self.act(self._bias(rows_bias(self.b1) if self.bias else None, mm(a, self.w1)))
        return self._bias(rows_bias(self.b2) if self.bias else None, mm(h, self.w2))

    def _bias(self, b, h):
        # a layer without bias adds none (its biases are zeros): a pass over the rows less
        if self.bias and b is not None:
            h += b
        return h


class TorchMoE:
    """What both torch layers share: the operands in the layer's precision, the routing, the local
    and shared experts, the all-to-all and the ordered combine."""

    def __init__(self, cfg: Config, inputs, rank: int, dtype: str = "float32", group=None, shared=None):
        import torch

        if dtype not in PRECISIONS:
            raise ValueError(f"baseline dtype {dtype!r} is not allowed: one of {', '.join(PRECISIONS)}")
        self.tf32 = dtype == "tf32"
        self.cfg, self.rank, self.group = cfg, rank, group
        self.dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self.x = inputs.x.to(self.dt)
        # gate operands as the path stores them (bf16-rounded on the bf16 path), in float64
        self.x64 = self.x.double()
        self.wg64 = inputs.wg.to(self.dt).double()
        self.offset, self.gate_bias = inputs.logit_offset, inputs.gate_bias
        # the gate's logit bias (with router_bias): the inputs' where they carry one, else the reference's
        bias = getattr(inputs, "wg_bias", None)
        if cfg.router_bias and bias is None:
            bias = torch.from_numpy(weights.router_bias(cfg)).to(self.x.device)
        self.router_bias = bias.to(self.dt).double() if cfg.router_bias else None
        self.experts = Experts(cfg, *(t.to(self.dt) for t in (inputs.w1, inputs.b1, inputs.w2, inputs.b2)))
        # the shared experts: given, the inputs' (random_inputs), else the reference's
        shared = shared if shared is not None else getattr(inputs, "shared", None)
        if shared is None and cfg.shared_experts:
            shared = shared_experts(cfg, self.x.device)
        self.shared = Experts(cfg, *(t.to(self.dt) for t in shared)) if shared is not None else None

    def route(self):
        """expert (T, k) int64, weight (T, k) float64, slot (T, k) int64 (-1 dropped), as reference.routing."""
        import torch

        cfg = self.cfg
        z = self.x64 @ self.wg64 - self.offset
        if self.router_bias is not None:
            z = z + self.router_bias
        score = torch.sigmoid(z) + self.gate_bias if cfg.gate == "sigmoid_bias" else z
        if cfg.n_group > 1:
            score = self._group_limited(score)
        top = torch.sort(-score, dim=-1, stable=True).indices[:, : cfg.top_k]
        picked = z.gather(1, top)
        if cfg.gate in ("softmax_topk", "softmax_topk_renorm"):
            w = torch.softmax(z, -1).gather(1, top)
            if cfg.gate == "softmax_topk_renorm":
                w = w / w.sum(-1, keepdim=True)
        elif cfg.gate == "topk_softmax":
            w = torch.softmax(picked, -1)
        elif cfg.gate == "sigmoid_topk":
            w = torch.sigmoid(picked)
        else:
            sp = torch.sigmoid(picked)
            w = sp / (sp.sum(-1, keepdim=True) + 1e-20)
        return top, w * cfg.routed_scaling, self._slots(top)

    def _group_limited(self, score):
        """Scores of experts outside the topk_group best groups set to -inf (a group's score: its
        best, for sigmoid_bias the sum of its two best; ties to the lower group)."""
        import torch

        cfg = self.cfg
        per = score.view(score.shape[0], cfg.n_group, -1)
        two = 2 if cfg.gate == "sigmoid_bias" else 1
        best = per.topk(min(two, per.shape[-1]), dim=-1).values.sum(-1)
        groups = torch.sort(-best, dim=-1, stable=True).indices[:, : cfg.topk_group]
        keep = torch.zeros_like(best, dtype=torch.bool).scatter_(1, groups, True)
        return per.masked_fill(~keep[..., None], -torch.inf).view_as(score)

    def _slots(self, top):
        """An assignment's rank among its expert's assignments in priority order (choice j first,
        then token), -1 past the capacity: a stable sort by expert groups them in that order. (A
        cumsum of a one-hot (T k, E) matrix over its rows, the obvious way, runs one thread per
        expert down 16K rows: about 5 ms on an H100, more than the bf16 layer itself.)"""
        import torch

        cfg = self.cfg
        order = top.t().reshape(-1)
        by_expert, perm = torch.sort(order, stable=True)
        counts = self._bincount(order, cfg.experts)
        first = torch.cumsum(counts, 0) - counts
        pos = torch.empty_like(order)
        pos[perm] = torch.arange(order.numel(), device=order.device) - first[by_expert]
        return torch.where(pos < cfg.slots, pos, -1).reshape(cfg.top_k, cfg.tokens).t().contiguous()

    @staticmethod
    def _bincount(keys, n: int):
        """Counts of 0..n-1 in keys (not torch.bincount: on CUDA it reads the maximum back to the host)."""
        import torch

        return torch.zeros(n, dtype=keys.dtype, device=keys.device).index_add_(0, keys, torch.ones_like(keys))

    def all_to_all(self, out, inp, out_splits=None, in_splits=None):
        """all_to_all_single into `out` (a copy on one rank without a process group)."""
        import torch.distributed as dist

        if self.cfg.ranks == 1 and not dist.is_initialized():
            out.copy_(inp)
        else:
            dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)
        return out

    def combine(self, rows, weight, kept):
        """(T, H) float32: each token's k rows (T, k, H) weighted and summed in choice order, then
        the shared experts' outputs (weight 1)."""
        import torch

        cfg = self.cfg
        y = torch.zeros(cfg.tokens, cfg.hidden, dtype=torch.float32, device=self.x.device)
        w = weight if not cfg.scale_before_expert else torch.ones_like(weight)
        w = torch.where(kept, w, 0.0).float()  # a dropped assignment's row (junk or zeros) weighs nothing
        for j in range(cfg.top_k):  # fixed combine order: choice 0, 1, .., k-1; one pass each
            y.addcmul_(rows[:, j], w[:, j, None])
        if self.shared is not None:
            out = self.shared_out()
            for s in range(cfg.shared_experts):
                y += out[s].float()
        return y

    def shared_out(self):
        """(S, T, H): every shared expert's output on all of this rank's tokens."""
        return self.shared.batched(self.x[None].expand(self.cfg.shared_experts, -1, -1))

    def token_rows(self, token, weight):
        """The rows that leave for the experts: tokens, scaled by their weight before the expert
        where the config says so (in float32, stored again in the layer's precision)."""
        rows = self.x[token]
        return (rows.float() * weight[:, None].float()).to(self.dt) if self.cfg.scale_before_expert else rows


class TorchLayer(TorchMoE):
    """The capacity-padded layer (see the module text)."""

    def forward(self):
        """(T, H) float32 output of this rank's tokens; also the routing it used."""
        import torch

        cfg = self.cfg
        T, H, E, K, C, P, L = cfg.tokens, cfg.hidden, cfg.experts, cfg.top_k, cfg.slots, cfg.ranks, cfg.local_experts
        # a process-wide switch: set on every call, so that layers of both kinds can take turns
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        expert, weight, slot = self.route()
        kept = slot >= 0
        # dropped assignments go to a spare last row instead of through a boolean mask, which
        # would make the host wait for the device (nonzero) in the middle of the layer
        dest = torch.where(kept, expert * C + slot, E * C).reshape(-1)
        rows = torch.zeros(E * C + 1, H, dtype=self.dt, device=self.x.device)
        token = torch.arange(T, device=self.x.device).repeat_interleave(K)
        rows[dest] = self.token_rows(token, weight.reshape(-1))
        send = rows[: E * C].view(E, C, H)
        recv = self.all_to_all(torch.empty_like(send), send)  # (E, ..) = (P, L, C, H) by owner -> by source
        a = recv.view(P, L, C, H).transpose(0, 1).reshape(L, P * C, H)
        back = self.experts.batched(a).view(L, P, C, H).transpose(0, 1).contiguous()
        ret = self.all_to_all(torch.empty_like(back), back).view(E, C, H)  # by owner = (E, C, H) of mine
        got = ret[expert, slot.clamp(min=0)]
        return self.combine(got, weight, kept), expert, weight, slot


class DroplessLayer(TorchMoE):
    """The dropless layer (see the module text); `gemm` "grouped" (torch._grouped_mm) or "loop"
    (one matmul per expert), by default grouped where torch has it, but for tf32."""

    def __init__(self, cfg: Config, inputs, rank: int, dtype: str = "float32", group=None, shared=None,
                 gemm: str | None = None):
        import torch

        super().__init__(cfg, inputs, rank, dtype, group, shared)
        # torch's grouped GEMM where it has one (torch 2.11 on an H100, Qwen3-30B-A3B's layer at 4K
        # tokens on one GPU: bf16 4.2 ms against 12.0 per expert, float32 11.6 against 12.7); tf32
        # per expert, where cuBLAS honours allow_tf32
        if gemm is None:
            gemm = "grouped" if hasattr(torch, "_grouped_mm") and not self.tf32 else "loop"
        if gemm not in GEMMS:
            raise ValueError(f"baseline gemm {gemm!r} is not allowed: one of {', '.join(GEMMS)}")
        self.gemm = gemm

    def forward(self):
        """(T, H) float32 output of this rank's tokens; also the routing it used."""
        import torch

        cfg = self.cfg
        d = self.dispatch()
        out = self.experts.grouped(d.rows, d.per_expert, d.per_expert_host, self.gemm)
        back = self._regroup(out, d.recv_counts, by_expert=False)
        ret = self.all_to_all(back.new_empty(d.mine.numel(), cfg.hidden), back, d.send_splits, d.recv_splits)
        got = torch.zeros(cfg.tokens * cfg.top_k, cfg.hidden, dtype=self.dt, device=self.x.device)
        got.index_copy_(0, d.mine, ret)
        return self.combine(got.view(cfg.tokens, cfg.top_k, cfg.hidden), d.weight, d.kept), d.expert, d.weight, d.slot

    def dispatch(self) -> SimpleNamespace:
        """The routing and the first all-to-all: the rows this rank's experts receive, expert by
        expert (`rows`, `per_expert` of them each, also on the host), which of this rank's (token,
        choice) assignments left (`mine`, sorted by expert) and both all-to-alls' split sizes."""
        import torch

        cfg = self.cfg
        E, K, P, L = cfg.experts, cfg.top_k, cfg.ranks, cfg.local_experts
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        expert, weight, slot = self.route()
        kept = slot >= 0
        # assignment t k + j, sorted by expert (dropped ones last, under the spare key E)
        key = torch.where(kept, expert, E).reshape(-1)
        perm = torch.sort(key, stable=True).indices
        counts = self._bincount(key, E + 1)[:E]
        recv_counts = self.all_to_all(torch.empty_like(counts), counts)  # (P, L): from source p to my expert l
        # the one read of the device by the host: every split size of both all-to-alls
        host = torch.cat([counts, recv_counts]).cpu().view(2, P, L).numpy()
        send_splits, recv_splits = host[0].sum(1).tolist(), host[1].sum(1).tolist()
        mine = perm[: sum(send_splits)]
        rows = self.token_rows(mine // K, weight.reshape(-1)[mine])
        recv = self.all_to_all(rows.new_empty(sum(recv_splits), cfg.hidden), rows, recv_splits, send_splits)
        # received source by source, each source's rows expert by expert: regroup expert by expert
        return SimpleNamespace(expert=expert, weight=weight, slot=slot, kept=kept, mine=mine,
                               rows=self._regroup(recv, host[1], by_expert=True), recv_counts=host[1],
                               per_expert=recv_counts.view(P, L).sum(0), per_expert_host=host[1].sum(0).tolist(),
                               send_splits=send_splits, recv_splits=recv_splits)

    def experts_alone(self):
        """A call of this rank's expert FFNs alone, as forward computes them on the rows it routes
        (the routed experts' grouped GEMMs, and the shared experts' on every token): the layer's
        expert work at the rate of torch's GEMMs, without its routing, all-to-alls and combine.
        Routes and dispatches once (collective) on the current stream, which the call it returns
        (local) must run on: its rows and counts are written there."""
        d = self.dispatch()

        def run():
            out = self.experts.grouped(d.rows, d.per_expert, d.per_expert_host, self.gemm)
            return (out, self.shared_out()) if self.shared is not None else (out,)
        return run

    @staticmethod
    def _regroup(rows, counts: np.ndarray, by_expert: bool):
        """Rows in (source, expert) chunks of `counts` (P, L) reordered to (expert, source) order
        (by_expert), or back from it."""
        import torch

        p, n = counts.shape
        if p == 1:
            return rows
        if by_expert:
            chunks = rows.split(counts.reshape(-1).tolist())
            return torch.cat([chunks[s * n + e] for e in range(n) for s in range(p)])
        chunks = rows.split(counts.T.reshape(-1).tolist())
        return torch.cat([chunks[e * p + s] for s in range(p) for e in range(n)])


# the torch layers a bench point is timed as (gpu.worker): the capacity-padded one, the dropless
# one (the yardstick) and the dropless one with one matmul per expert (the plain version of it)
KINDS = {"padded": (TorchLayer, {}), "dropless": (DroplessLayer, {}), "loop": (DroplessLayer, {"gemm": "loop"})}


def make(kind: str, cfg: Config, inputs, rank: int, dtype: str, group=None):
    """The torch layer of `kind` (KINDS)."""
    if kind not in KINDS:
        raise ValueError(f"torch layer {kind!r} is not allowed: one of {', '.join(KINDS)}")
    cls, kw = KINDS[kind]
    return cls(cfg, inputs, rank, dtype, group, **kw)


def padded_bytes(cfg: Config, dtype: str) -> int:
    """Device memory the padded layer's buffers take on one rank, at most: its E C rows of H (send,
    receive, regrouped, expert output, sent back, returned) and of GEMM0's I' (before and after the
    activation). At 16K tokens of Qwen3-30B-A3B's layer (C = T) about 58 GB."""
    rows = cfg.experts * cfg.slots
    return rows * (6 * cfg.hidden + 2 * weights.ffn_in_width(cfg)) * (2 if dtype == "bfloat16" else 4)
