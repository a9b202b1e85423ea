"""The one MoE configuration: the layer, the parallel layout and the tile shape.

Every part of moelab (golden, simulator, kernel, app) is driven by a `Config`. It is validated
when built: a bad value raises `ConfigError` naming the field, the value and what is allowed.
Configs load from and save to TOML or JSON files with the same flat keys as the dataclass; files
written before the one `precision` field (with `dtype`, `tf32`, `tf32x3`) are upgraded as they are read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .files import FileError, check_output, parse_json, read_text

# routers (reference/routing.py has each one's formula and the model families that use it)
GATES = ("softmax_topk", "softmax_topk_renorm", "topk_softmax", "sigmoid_bias", "sigmoid_topk")
ACTIVATIONS = ("relu", "gelu_tanh", "gelu", "silu", "swiglu", "swiglu_oai")
GATED_ACTIVATIONS = ("swiglu", "swiglu_oai")  # W1 holds [gate | up] halves: 2 x ffn columns
# what the expert GEMMs multiply in: float32 FMAs; float32 data on TF32 tensor cores, operands rounded to
# TF32 (10-bit mantissa); float32 data on TF32 tensor cores at float32's accuracy (each operand split into
# a TF32 part and a TF32 remainder, three products: 3xTF32); bfloat16 data on bf16 tensor cores. Products
# accumulate in float32; the gate stays float64.
PRECISIONS = ("float32", "tf32", "tf32x3", "bfloat16")
PLACEMENTS = ("contiguous",)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}  # by storage element type (Config.dtype)
# the fields files written before `precision` carry instead of it (upgrade_precision reads them)
LEGACY_PRECISION_FIELDS = ("dtype", "tf32", "tf32x3")


class ConfigError(ValueError):
    """A config field holds a value that is not allowed."""

    def __init__(self, name: str, value, allowed: str):
        self.field, self.value, self.allowed = name, value, allowed
        super().__init__(f"config field '{name}' = {value!r} is not allowed: {allowed}")


def is_positive_int(value) -> bool:
    """A whole number of at least 1 (a bool is not one)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _positive_int(name, value):
    if not is_positive_int(value):
        raise ConfigError(name, value, "a positive integer")


def _choice(name, value, choices):
    if value not in choices:
        raise ConfigError(name, value, "one of " + ", ".join(choices))


@dataclass(frozen=True)
class Config:
    """An MoE layer run by `ranks` GPUs; T tokens live on each rank."""

    name: str = "custom"
    # the layer
    tokens: int = 128  # T: tokens per rank
    hidden: int = 64  # H: model dim
    ffn: int = 128  # I: expert FFN dim
    experts: int = 8  # E: routed experts
    top_k: int = 2  # k
    gate: str = "softmax_topk"
    # group-limited top-k (DeepSeek-V2/V3): experts in n_group equal groups, the k picked from the
    # topk_group best groups only; 1 and 1: plain top-k
    n_group: int = 1
    topk_group: int = 1
    routed_scaling: float = 1.0  # every routed weight multiplied by this (DeepSeek's routed_scaling_factor)
    router_bias: bool = False  # the gate projection has a bias added to its logits (gpt-oss)
    # the routed weight scales the token before the expert, not the expert's output (Llama 4)
    scale_before_expert: bool = False
    capacity_factor: float | None = 1.0  # None: no dropping
    activation: str = "relu"
    swiglu_limit: float = 7.0  # swiglu_oai's clamp: gate <= limit, -limit <= up <= limit (gpt-oss)
    bias: bool = True
    shared_experts: int = 0  # dense experts every token goes through with weight 1
    skew: float = 0.0  # load imbalance: -skew * ln(1 + e) is added to expert e's gate logit
    precision: str = "float32"  # the expert GEMMs' precision (PRECISIONS); it fixes dtype, the storage type
    seed: int = 0
    # the parallel layout
    ranks: int = 1  # P: GPUs holding experts, one process each
    gpus_per_node: int = 8
    placement: str = "contiguous"
    # the tile shape
    tile_m: int = 128  # bM: token rows per tile
    tile_n: int = 64  # bN: output columns per GEMM task
    tile_k: int = 8  # bK: reduction depth per step inside a task
    # an expert's rows from every source rank share its tiles: tiles are windows of tile_m slots
    # over the expert's ranks x C slots (reference/plan.py), so few rows per source still fill a
    # tile; False: each (source rank, expert) block has tiles of its own
    merge_sources: bool = True

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("name", self.name, "a non-empty string")
        for f in ("tokens", "hidden", "ffn", "experts", "top_k", "n_group", "topk_group", "ranks",
                  "gpus_per_node", "tile_m", "tile_n", "tile_k"):
            _positive_int(f, getattr(self, f))
        if self.top_k > self.experts:
            raise ConfigError("top_k", self.top_k, f"at most experts = {self.experts}")
        _choice("gate", self.gate, GATES)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("placement", self.placement, PLACEMENTS)
        cf = self.capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float))
                               or not math.isfinite(cf) or cf <= 0):
            raise ConfigError("capacity_factor", cf, "a positive number, or None for no dropping")
        if isinstance(self.skew, bool) or not isinstance(self.skew, (int, float)) \
                or not math.isfinite(self.skew) or self.skew < 0:
            raise ConfigError("skew", self.skew, "a finite number >= 0 (0: no imbalance)")
        for f in ("bias", "router_bias", "scale_before_expert"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f, getattr(self, f), "true or false")
        for f in ("routed_scaling", "swiglu_limit"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f, v, "a finite number > 0")
        if self.experts % self.n_group:
            raise ConfigError("n_group", self.n_group, f"a divisor of experts = {self.experts}")
        if self.topk_group > self.n_group:
            raise ConfigError("topk_group", self.topk_group, f"at most n_group = {self.n_group}")
        if self.top_k > self.topk_group * (self.experts // self.n_group):
            raise ConfigError("topk_group", self.topk_group,
                              f"large enough that the {self.topk_group} best groups of "
                              f"{self.experts // self.n_group} experts hold top_k = {self.top_k}")
        if self.scale_before_expert and self.top_k != 1:
            raise ConfigError("scale_before_expert", self.scale_before_expert,
                              f"false with top_k = {self.top_k} (a token scaled before its expert has one routed "
                              "expert, as Llama 4's top-1)")
        if not isinstance(self.merge_sources, bool):
            raise ConfigError("merge_sources", self.merge_sources, "true or false")
        if isinstance(self.shared_experts, bool) or not isinstance(self.shared_experts, int) \
                or self.shared_experts < 0:
            raise ConfigError("shared_experts", self.shared_experts, "an integer >= 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ConfigError("seed", self.seed, "an integer in [0, 2**63)")
        if self.experts % self.ranks:
            raise ConfigError("experts", self.experts,
                              f"a multiple of ranks = {self.ranks} (contiguous placement gives "
                              "every rank experts/ranks experts; uneven splits are not supported)")
        if self.ranks > self.gpus_per_node and self.ranks % self.gpus_per_node:
            raise ConfigError("ranks", self.ranks,
                              f"at most gpus_per_node = {self.gpus_per_node}, or a multiple of it "
                              "(whole nodes)")
        if self.gated and self.tile_n % 2:
            raise ConfigError("tile_n", self.tile_n, f"even with activation {self.activation!r} (a GEMM0 task's "
                              "tile_n weight columns are half its columns' gate, half their up)")
        # tile_n need not divide H or I: the last column block of a GEMM is ragged
        for f in ("hidden", "ffn"):
            if getattr(self, f) % self.tile_k:
                raise ConfigError(f, getattr(self, f), f"a multiple of tile_k = {self.tile_k}")

    # derived layout
    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.gpus_per_node)

    @property
    def local_experts(self) -> int:
        return self.experts // self.ranks

    @property
    def gated(self) -> bool:
        """W1 holds a gate and an up half (2 x ffn columns), multiplied after the activation."""
        return self.activation in GATED_ACTIVATIONS

    @property
    def dtype(self) -> str:
        """The storage element type of tokens, weights and the rows moved: "bfloat16" for a bfloat16
        config, else "float32" (tf32 and tf32x3 multiply float32 data)."""
        return "bfloat16" if self.precision == "bfloat16" else "float32"

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def capacity(self) -> int | None:
        """Slots per (source rank, expert): C = ceil(capacity_factor * T * k / E); None: no cap."""
        if self.capacity_factor is None:
            return None
        # round before ceil so that e.g. 1.1 * 10 does not become 11.000000000000002 -> 12
        return max(1, math.ceil(round(self.capacity_factor * self.tokens * self.top_k / self.experts, 9)))

    @property
    def slots(self) -> int:
        """C as the kernel lays out its buffers: the capacity, at most T (a token picks an expert
        at most once, so no block exceeds T rows); T when nothing is dropped."""
        return self.tokens if self.capacity is None else min(self.capacity, self.tokens)

    def owner(self, expert: int) -> int:
        """Rank holding `expert` (contiguous blocks of experts / ranks)."""
        return expert // self.local_experts

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def replace(self, **changes) -> Config:
        """A copy with `changes` applied and validated again."""
        unknown = sorted(set(changes) - set(field_names()))
        if unknown:
            raise _unknown(unknown[0], changes[unknown[0]])
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in field_names()}

    def save(self, path: str | Path) -> None:
        path = check_output(path, (".toml", ".json"))
        d = self.to_dict()
        path.write_text(json.dumps(d, indent=2) + "\n" if path.suffix == ".json" else to_toml(d))

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        if not isinstance(d, dict):
            raise ConfigError("config", d, "a table of config fields")
        d = dict(upgrade_precision(d))
        unknown = sorted(set(d) - set(field_names()))
        if unknown:
            raise _unknown(unknown[0], d[unknown[0]])
        if d.get("capacity_factor") == "none":
            d["capacity_factor"] = None
        for f in ("capacity_factor", "skew", "routed_scaling", "swiglu_limit"):
            if isinstance(d.get(f), int) and not isinstance(d[f], bool):
                d[f] = float(d[f])
        return cls(**d)

    @classmethod
    def load(cls, path: str | Path) -> Config:
        """A config file: a TOML table or a JSON object of the flat fields (at least one)."""
        path = Path(path)
        expected = "a .toml or .json config file of fields: " + ", ".join(field_names()[:6]) + ", ..."
        if path.suffix not in (".toml", ".json"):
            raise FileError(path, "has the wrong suffix", expected)
        text = read_text(path, expected)
        if path.suffix == ".json":
            d = parse_json(path, text, expected)
        else:
            try:
                d = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise FileError(path, f"is not well-formed TOML ({e})", expected) from e
        if not d:
            raise FileError(path, "holds no config fields", expected)
        try:
            return cls.from_dict(d)
        except ConfigError as e:  # the field's error, saying which file holds it
            raise ConfigError(e.field, e.value, f"{e.allowed} (in {path})") from e


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Config)]


def _unknown(name: str, value) -> ConfigError:
    if name in LEGACY_PRECISION_FIELDS:
        return ConfigError(name, value, "not a field: precision = one of " + ", ".join(PRECISIONS) + " replaces "
                           "dtype, tf32 and tf32x3")
    return ConfigError(name, value, "a known field: " + ", ".join(field_names()))


def upgrade_precision(d: dict) -> dict:
    """`d` with the precision that the fields of a file written before `precision` name (dtype, tf32,
    tf32x3, any of them absent: float32, false, false) in their place; `d` itself if it has none.
    Both kinds at once, or old fields that contradict each other, raise ConfigError."""
    old = [f for f in LEGACY_PRECISION_FIELDS if f in d]
    if not old:
        return d
    if "precision" in d:
        raise ConfigError(old[0], d[old[0]], f"absent beside precision = {d['precision']!r}: precision, one of "
                          + ", ".join(PRECISIONS) + ", replaces dtype, tf32 and tf32x3 (give precision alone)")
    d = dict(d)
    dtype, tf32, tf32x3 = d.pop("dtype", "float32"), d.pop("tf32", False), d.pop("tf32x3", False)
    _choice("dtype", dtype, ("float32", "bfloat16"))
    for name, v in (("tf32", tf32), ("tf32x3", tf32x3)):
        if not isinstance(v, bool):
            raise ConfigError(name, v, "true or false")
    if tf32 and tf32x3:
        raise ConfigError("tf32x3", tf32x3, "false with tf32 = true (one GEMM precision: tf32 or tf32x3)")
    if (tf32 or tf32x3) and dtype != "float32":
        name = "tf32" if tf32 else "tf32x3"
        raise ConfigError(name, True, f"false with dtype = {dtype!r} ({name} multiplies float32 data: true only "
                          "with dtype float32)")
    d["precision"] = "tf32" if tf32 else "tf32x3" if tf32x3 else dtype
    return d


def to_toml(d: dict) -> str:
    """A flat table of config fields as TOML text (None as "none", as Config.load reads it)."""
    lines = []
    for k, v in d.items():
        if v is None:
            v = "none"
        if isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            lines.append(f"{k} = {v!r}")
        else:
            lines.append(f"{k} = {json.dumps(str(v))}")
    return "\n".join(lines) + "\n"
