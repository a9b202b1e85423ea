"""The same MoE layer in plain torch (Megatron style), the baseline the kernel is timed against.

gate (float64 logits of the path's operands, the reference's routing rule) | capacity-padded
send buffer (E, C, H) | all_to_all_single dispatch | per-local-expert batched GEMMs (torch.bmm
over the (L, P * C, H) received rows: one grouped call per GEMM) | all_to_all_single back |
combine of each token's k rows in choice order. float32 (no TF32), tf32 (float32 data, cuBLAS
allowed TF32 tensor cores for the expert GEMMs, as the kernel of a tf32 config multiplies) or
bfloat16 operands with float32 combine. One process per GPU, NCCL for the all-to-alls.
"""

from __future__ import annotations

from reference import Config

from .layout import Sizes


class TorchLayer:
    def __init__(self, cfg: Config, inputs, rank: int, dtype: str = "float32", group=None):
        import torch

        if dtype not in ("float32", "tf32", "bfloat16"):
            raise ValueError(f"baseline dtype {dtype!r} is not allowed: float32, tf32 or bfloat16")
        self.tf32 = dtype == "tf32"
        self.cfg, self.rank, self.group = cfg, rank, group
        self.s = Sizes.of(cfg)
        self.dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        cast = (lambda t: t.to(torch.bfloat16)) if dtype == "bfloat16" else (lambda t: t)
        self.x, self.w1, self.b1, self.w2, self.b2 = (cast(t) for t in (inputs.x, inputs.w1, inputs.b1, inputs.w2,
                                                                       inputs.b2))
        # gate operands as the path stores them (bf16-rounded on the bf16 path), in float64
        self.x64 = self.x.double()
        self.wg64 = cast(inputs.wg).double()
        self.offset, self.gate_bias = inputs.logit_offset, inputs.gate_bias
        self.act = {"relu": torch.relu, "gelu_tanh": lambda h: torch.nn.functional.gelu(h, approximate="tanh"),
                    "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}[cfg.activation]

    def route(self):
        """expert (T, k), weight (T, k) float64, slot (T, k) (-1 dropped), as reference.routing."""
        import torch

        cfg, s = self.cfg, self.s
        z = self.x64 @ self.wg64 - self.offset
        score = torch.sigmoid(z) + self.gate_bias if cfg.gate == "sigmoid_bias" else z
        top = torch.sort(-score, dim=-1, stable=True).indices[:, : s.K]
        picked = z.gather(1, top)
        if cfg.gate in ("softmax_topk", "softmax_topk_renorm"):
            w = torch.softmax(z, -1).gather(1, top)
            if cfg.gate == "softmax_topk_renorm":
                w = w / w.sum(-1, keepdim=True)
        elif cfg.gate == "topk_softmax":
            w = torch.softmax(picked, -1)
        else:
            sp = torch.sigmoid(picked)
            w = sp / sp.sum(-1, keepdim=True)
        # a slot is the assignment's rank among its expert's assignments in priority order (choice j
        # first, then token): a stable sort by expert groups them in that order. (A cumsum of a
        # one-hot (T k, E) matrix over its rows, the obvious way, runs one thread per expert down
        # 16K rows: about 5 ms on an H100, more than the bf16 layer itself.)
        order = top.t().reshape(-1)
        by_expert, perm = torch.sort(order, stable=True)
        # (not torch.bincount: on CUDA it reads the maximum back to the host, a sync mid-layer)
        counts = torch.zeros(s.E, dtype=order.dtype, device=order.device).index_add_(0, order, torch.ones_like(order))
        first = torch.cumsum(counts, 0) - counts
        pos = torch.empty_like(order)
        pos[perm] = torch.arange(order.numel(), device=order.device) - first[by_expert]
        slot = torch.where(pos < s.C, pos, -1).reshape(s.K, s.T).t().contiguous()
        return top.to(torch.int32), w, slot.to(torch.int32)

    def forward(self):
        """(T, H) float32 output of this rank's tokens; also the routing it used."""
        import torch
        import torch.distributed as dist

        s = self.s
        # a process-wide switch: set on every call, so that layers of both kinds can take turns
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        expert, weight, slot = self.route()
        kept = slot >= 0
        # dropped assignments go to a spare last row instead of through a boolean mask, which
        # would make the host wait for the device (nonzero) in the middle of the layer
        dest = torch.where(kept, expert.long() * s.C + slot.long(), s.E * s.C).reshape(-1)
        rows = torch.zeros(s.E * s.C + 1, s.H, dtype=self.dt, device=self.x.device)
        rows[dest] = self.x[:, None, :].expand(s.T, s.K, s.H).reshape(s.T * s.K, s.H)
        send = rows[: s.E * s.C].view(s.E, s.C, s.H)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)  # (E, ..) = (P, L, C, H) by owner -> by source
        a = recv.view(s.P, s.L, s.C, s.H).transpose(0, 1).reshape(s.L, s.P * s.C, s.H)
        # a layer without bias adds none (its b1, b2 are zeros): two passes over the hidden rows less
        h = torch.bmm(a, self.w1)
        if self.cfg.bias:
            h += self.b1[:, None, :]
        h = self.act(h)
        o = torch.bmm(h, self.w2)
        if self.cfg.bias:
            o += self.b2[:, None, :]
        back = o.view(s.L, s.P, s.C, s.H).transpose(0, 1).contiguous()
        ret = torch.empty_like(back)
        dist.all_to_all_single(ret, back, group=self.group)  # (P, L, C, H) by owner = (E, C, H) of mine
        ret = ret.view(s.E, s.C, s.H).float()
        y = torch.zeros(s.T, s.H, dtype=torch.float32, device=self.x.device)
        for j in range(s.K):  # fixed combine order: choice 0, 1, .., k-1
            rows = ret[expert[:, j].long(), slot[:, j].clamp(min=0).long()]
            y += torch.where(kept[:, j, None], weight[:, j, None].float() * rows, 0.0)
        return y, expert, weight, slot
