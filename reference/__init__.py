"""moelab's reference: config, presets, routing, the tile plan and the golden MoE forward.

NumPy only. `import reference` is all the simulator, the kernel launcher and the app need to
agree on what one layer call computes and which tiles of work it is made of.
"""

from . import golden, numerics, plan, presets, routing, weights
from .config import Config, ConfigError
from .golden import max_rel_error
from .plan import TilePlan
from .routing import Routing


def route_config(cfg: Config) -> Routing:
    """The routing of `cfg`'s seeded inputs (draws the gate, not the experts), each rank's in turn.
    On one node, where the kernel and the golden run, it is the golden's, token for token: each
    rank's tokens drawn and routed. Across nodes, where only the simulator goes, each token's gate
    logits are drawn from their distribution instead (routing.sampled_logits): the same routing
    statistics for min(H, E) / H of the work, which at hundreds of GPUs is most of a run's."""
    wg, gate_bias = weights.gate(cfg)
    wg_bias = weights.router_bias(cfg)
    if routing.sampled(cfg):
        r = routing.gate_factor(cfg, wg)
        z = (routing.sampled_logits(cfg, weights.gate_inputs(cfg, p), r, wg_bias) for p in range(cfg.ranks))
        return routing.route_logits(cfg, z, gate_bias)
    return routing.route(cfg, (weights.tokens(cfg, p) for p in range(cfg.ranks)), wg, gate_bias, wg_bias)


def plan_of(cfg: Config) -> TilePlan:
    """The tile plan of `cfg`'s seeded layer call."""
    return plan.build(cfg, route_config(cfg))


__all__ = ["Config", "ConfigError", "Routing", "TilePlan", "golden", "max_rel_error", "numerics",
           "plan", "plan_of", "presets", "route_config", "routing", "weights"]
