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
    """The routing of `cfg`'s seeded inputs (draws the tokens and the gate, not the experts); each
    rank's tokens are drawn, routed and dropped in turn (all of them at once outgrow the memory at
    cluster scale: 512 GPUs of 4096 x 2048 float32 tokens are 17 GB)."""
    wg, gate_bias = weights.gate(cfg)
    return routing.route(cfg, (weights.tokens(cfg, r) for r in range(cfg.ranks)), wg, gate_bias,
                         weights.router_bias(cfg))


def plan_of(cfg: Config) -> TilePlan:
    """The tile plan of `cfg`'s seeded layer call."""
    return plan.build(cfg, route_config(cfg))


__all__ = ["Config", "ConfigError", "Routing", "TilePlan", "golden", "max_rel_error", "numerics",
           "plan", "plan_of", "presets", "route_config", "routing", "weights"]
