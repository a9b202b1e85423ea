"""The megakernel as a torch module-like layer, for a model run under torchrun (one process per GPU).

    layer = gpu.MoELayer(cfg, weights)   # weights given once, as torch tensors on this GPU
    y = layer.forward(x)                 # x (T, H) on this GPU, new tokens every call; y (T, H) float32

Every rank builds the layer with the same config (cfg.ranks = WORLD_SIZE) and calls forward the same
number of times: the layer's NVSHMEM buffers and every call are collective. The first layer of a
process starts its NVSHMEM session from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT), as gpu.worker does, joining a torch.distributed process group already
initialised.

Weights (a dict of torch tensors on this process's GPU, any floating dtype; moelab's layouts, x @ W):
    wg         (H, E)       the router's weight (a Hugging Face router's `weight` is (E, H): pass .T)
    wg_bias    (E,)         the router's bias, added to its logits (needed with router_bias, else absent)
    gate_bias  (E,)         the selection-only bias of sigmoid_bias (DeepSeek-V3's
                            e_score_correction_bias; absent: zeros)
    w1         (N, H, I')   expert weights, I' = 2 I for gated activations ([gate | up] columns)
    b1         (N, I')      absent without bias
    w2         (N, I, H)
    b2         (N, H)       absent without bias
N is either every routed expert (E: the layer takes this rank's E / ranks) or this rank's own
(E / ranks, experts rank * E / ranks onwards). The kernel's precision is the config's: a bfloat16
config rounds the weights and tokens to bf16 (x may be given in bf16 or float32), the others keep
float32.
"""

from __future__ import annotations

import numpy as np

from reference import Config

from . import layout

_session = None  # this process's runtime.Session: NVSHMEM is initialised once per process


def session():
    """This process's runtime.Session, started on first use from torchrun's environment."""
    from .runtime import Session

    global _session
    if _session is None:
        _session = Session.start()
    return _session


class MoELayer:
    """cfg's MoE layer on this process's GPU: the weights uploaded once, forward(x) a layer call."""

    def __init__(self, cfg: Config, weights: dict, *, timeout_ms: float = 5000.0, on=None):
        """`on`: the runtime.Session to run on (default: this process's, started on first use)."""
        import torch

        from .runtime import Inputs, Layer, logit_offset  # torch, cuda.core and nvshmem4py: imported on use

        layout.check_supported(cfg)
        self.cfg, self.session = cfg, on or session()
        self.device = torch.device("cuda", self.session.local_rank)
        self.elem = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        w = _checked(cfg, weights, self.session.rank, self.device)
        e = cfg.experts
        inputs = Inputs(x=torch.zeros(cfg.tokens, cfg.hidden, device=self.device), wg=w["wg"],
                        logit_offset=torch.from_numpy(logit_offset(cfg)).to(self.device),
                        gate_bias=w.get("gate_bias", torch.zeros(e, device=self.device)).double(),
                        wg_bias=w.get("wg_bias", torch.zeros(e, device=self.device)).double(),
                        w1=w["w1"], b1=w["b1"], w2=w["w2"], b2=w["b2"]).as_dtype(cfg.dtype)
        self.layer = Layer(self.session, cfg, inputs, timeout_ms=timeout_ms)

    def forward(self, x):
        """This rank's (T, H) float32 output for its (T, H) tokens x (cfg.tokens of them, on this GPU,
        bf16 or float32). Collective: every rank calls it. Raises gpu.KernelError if a wait timed out."""
        import torch

        want = (self.cfg.tokens, self.cfg.hidden)
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != want or x.device != self.device \
                or x.dtype not in (torch.float32, torch.bfloat16):
            got = f"{tuple(x.shape)} {x.dtype} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"MoELayer.forward: x = {got} is not allowed: a {want} float32 or bfloat16 tensor "
                             f"on {self.device} (cfg.tokens tokens of cfg.hidden)")
        s = self.session
        s.torch_stream.wait_stream(torch.cuda.current_stream(self.device))  # x is written
        with torch.cuda.stream(s.torch_stream):
            self.layer.inputs.x.copy_(x)
        self.layer.run()
        with torch.cuda.stream(s.torch_stream):
            y = self.layer.buffers["y"].clone()
        torch.cuda.current_stream(self.device).wait_stream(s.torch_stream)
        return y

    __call__ = forward

    def routing(self) -> dict[str, np.ndarray]:
        """The last call's routing of this rank's tokens: expert, weight, slot (T, k), counts (E,)."""
        return self.layer.routing()

    def close(self) -> None:
        """Free the layer's NVSHMEM buffers (collective: every rank closes its layer)."""
        self.layer.close()


def _checked(cfg: Config, weights: dict, rank: int, device) -> dict:
    """The weights as float32 tensors of this rank's experts, each checked for its shape, dtype and
    device; one ValueError names the first that is not allowed."""
    import torch

    if not isinstance(weights, dict):
        raise ValueError(f"MoELayer weights = {type(weights).__name__} is not allowed: a dict of torch tensors")
    h, e, lo = cfg.hidden, cfg.experts, rank * cfg.local_experts
    n_in = 2 * cfg.ffn if cfg.gated else cfg.ffn
    shapes = {"wg": (h, e), "wg_bias": (e,), "gate_bias": (e,), "w1": (h, n_in), "b1": (n_in,),
              "w2": (cfg.ffn, h), "b2": (h,)}
    needed = {"wg", "w1", "w2"} | ({"b1", "b2"} if cfg.bias else set()) | ({"wg_bias"} if cfg.router_bias else set())
    allowed_names = needed | ({"gate_bias"} if cfg.gate == "sigmoid_bias" else set())
    unknown = sorted(set(weights) - allowed_names)
    if unknown:
        raise ValueError(f"MoELayer weight {unknown[0]!r} is not allowed for this config (bias = {cfg.bias}, "
                         f"router_bias = {cfg.router_bias}, gate = {cfg.gate!r}): the weights are "
                         f"{', '.join(sorted(allowed_names))}")
    out = {}
    for name, shape in shapes.items():
        if name not in weights:
            if name in needed:
                raise ValueError(f"MoELayer weight {name!r} is missing: a {shape} tensor is needed for this config")
            continue
        v = weights[name]
        per_expert = name in ("w1", "b1", "w2", "b2")
        allowed = [(n, *shape) for n in dict.fromkeys((e, cfg.local_experts))] if per_expert else [shape]
        if not isinstance(v, torch.Tensor) or tuple(v.shape) not in allowed or not v.is_floating_point() \
                or v.device != device:
            got = f"{tuple(v.shape)} {v.dtype} on {v.device}" if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(f"MoELayer weight {name!r} = {got} is not allowed: a floating tensor "
                             f"{' or '.join(map(str, allowed))} on {device}")
        if per_expert and v.shape[0] == e and e != cfg.local_experts:
            v = v[lo: lo + cfg.local_experts]  # this rank's experts of all E
        out[name] = v.float().contiguous()
    if not cfg.bias:
        out["b1"] = torch.zeros(cfg.local_experts, n_in, device=device)
        out["b2"] = torch.zeros(cfg.local_experts, h, device=device)
    return out
