"""The golden file (`moelab golden --out FILE.npz`): a layer call's config, inputs, weights,
routing and outputs, saved and loaded here only.

Arrays: `config` and `plan_summary` (JSON text), `w_<name>` for each of `reference.weights.Weights`'
arrays, `route_expert`, `route_weight`, `route_slot`, and `y_<path>` per precision path
(reference.numerics.PATHS). `load` refuses, in one line naming the file, anything else: a missing,
empty or truncated file, missing arrays, a bad config, NaN or inf.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from .config import Config, ConfigError
from .files import FileError, check_output, finite, json_of_array, load_npz
from .numerics import PATHS
from .routing import Routing
from .weights import Weights

WEIGHTS = tuple(f.name for f in dataclasses.fields(Weights))
ROUTING = ("route_expert", "route_weight", "route_slot")
REQUIRED = ("config", *(f"w_{k}" for k in WEIGHTS), *ROUTING)
EXPECTED = "a golden .npz written by `moelab golden --out` (config, w_*, route_* and y_<path> arrays)"


@dataclasses.dataclass(frozen=True)
class Golden:
    config: Config
    weights: Weights
    routing: Routing
    outputs: dict[str, np.ndarray]  # precision path -> (P, T, H)


def save(path, cfg: Config, weights: Weights, routing: Routing, plan_summary: dict,
         outputs: dict[str, np.ndarray]) -> None:
    """Write exactly `path` (which must end in .npz: numpy would add the suffix otherwise)."""
    check_output(path, (".npz",))
    np.savez_compressed(
        path, config=json.dumps(cfg.to_dict()), plan_summary=json.dumps(plan_summary),
        **{f"w_{k}": getattr(weights, k) for k in WEIGHTS},
        route_expert=routing.expert, route_weight=routing.weight, route_slot=routing.slot,
        **{f"y_{p}": y for p, y in outputs.items()})


def load(path) -> Golden:
    data = load_npz(path, EXPECTED, REQUIRED)
    try:
        cfg = Config.from_dict(json_of_array(path, data, "config", EXPECTED))
    except ConfigError as e:
        raise FileError(path, f"holds a config that is not allowed ({e})", EXPECTED) from e
    outputs = {k[2:]: v for k, v in data.items() if k.startswith("y_")}
    unknown = sorted(set(outputs) - set(PATHS))
    if not outputs or unknown:
        raise FileError(path, f"holds outputs {sorted(outputs)}", EXPECTED + f"; paths among {', '.join(PATHS)}")
    p, t, h, k = cfg.ranks, cfg.tokens, cfg.hidden, cfg.top_k
    shapes = {"w_x": (p, t, h), "route_expert": (p, t, k), "route_weight": (p, t, k), "route_slot": (p, t, k),
              **{f"y_{q}": (p, t, h) for q in outputs}}
    for key, shape in shapes.items():
        if data[key].shape != shape:
            raise FileError(path, f"holds '{key}' of shape {data[key].shape}", f"shape {shape} for its config")
    for key, value in data.items():
        finite(path, key, value, EXPECTED)
    n_exp = cfg.experts + cfg.shared_experts
    if data["route_expert"].dtype.kind not in "iu" or data["route_expert"].size and not (
            data["route_expert"].min() >= 0 and data["route_expert"].max() < cfg.experts):
        raise FileError(path, "holds 'route_expert' outside the config's experts", EXPECTED)
    if data["w_w1"].shape[:2] != (n_exp, h):
        raise FileError(path, f"holds 'w_w1' of shape {data['w_w1'].shape}", f"{n_exp} experts of {h} rows")
    w = Weights(**{k: data[f"w_{k}"] for k in WEIGHTS})
    r = Routing(data["route_expert"], data["route_weight"], data["route_slot"])
    return Golden(cfg, w, r, outputs)
