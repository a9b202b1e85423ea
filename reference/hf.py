"""A Config from a Hugging Face model's config.json (`moelab configs --from-hf`): the MoE layer of
each family, its field names mapped to moelab's, on disk, no network.

Families (model_type) and what each reads, with the Transformers modeling code it follows:
- mixtral: hidden_size, intermediate_size, num_local_experts, num_experts_per_tok; softmax, top-k,
  renormalized (softmax_topk_renorm); SwiGLU experts, no biases.
- qwen3_moe: hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok, norm_topk_prob
  (true: softmax_topk_renorm, false: softmax_topk); SwiGLU, no biases, no shared expert.
- deepseek_v2: hidden_size, moe_intermediate_size, n_routed_experts, num_experts_per_tok,
  n_shared_experts, scoring_func (softmax), topk_method (greedy, or group_limited_greedy with
  n_group and topk_group), routed_scaling_factor: softmax_topk, the weights scaled by the factor
  and not renormalized, as DeepseekV2Moe does whatever norm_topk_prob says.
- deepseek_v3: the same fields, scoring_func sigmoid, topk_method noaux_tc, norm_topk_prob true:
  sigmoid_bias with n_group, topk_group and routed_scaling.
- llama4 (the text_config inside) or llama4_text: hidden_size, intermediate_size,
  num_local_experts, num_experts_per_tok: sigmoid_topk scaling the token before its expert
  (scale_before_expert, top-1), one shared expert of intermediate_size; SwiGLU, no biases.
- gpt_oss: hidden_size, intermediate_size, num_local_experts, num_experts_per_tok (or
  experts_per_token), swiglu_limit: topk_softmax with the router's bias, swiglu_oai experts with
  biases.
The gated families' hidden_act must be silu. The run's fields come from DEFAULTS, the zoo's
(presets.ZOO_RUN: bf16 at the bf16 kernel's tile, nothing dropped, 4 GPUs of an 8-GPU node;
tokens and ranks may be given). Every problem is one ConfigError naming the file, the field and what is allowed.
"""

from __future__ import annotations

from pathlib import Path

from . import presets
from .config import Config, ConfigError
from .files import read_json

FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "llama4", "llama4_text", "gpt_oss")
FAMILIES_HELP = "model_type one of " + ", ".join(FAMILIES)
DEFAULTS = presets.ZOO_RUN  # the run fields: the zoo's


class _Fields:
    """The config file's fields, read with their types checked; errors name the file and field."""

    def __init__(self, path: str, d: dict, family: str = "this family", prefix: str = ""):
        self.path, self.d, self.family, self.prefix = path, d, family, prefix

    def error(self, name: str, value, allowed: str) -> ConfigError:
        return ConfigError(f"{self.path}: {self.prefix}{name}", value, allowed)

    def get(self, name: str, kind: type, default=None, *alternatives: str):
        """Field `name` (or the first of `alternatives` present) of type `kind`; `default` when
        absent, or an error when the default is None."""
        for key in (name, *alternatives):
            if key in self.d:
                value = self.d[key]
                ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
                if kind is float and isinstance(value, int) and not isinstance(value, bool):
                    value, ok = float(value), True
                if not ok:
                    raise self.error(key, value, _TYPE_NAMES[kind])
                return value
        if default is None:
            also = "".join(f" (or {k!r})" for k in alternatives)
            raise self.error(name, "missing", f"present{also}: {self.family}'s MoE layer needs it")
        return default

    def choice(self, name: str, allowed: tuple, default=None):
        value = self.get(name, type(allowed[0]), default)
        if value not in allowed:
            raise self.error(name, value, "one of " + ", ".join(map(repr, allowed)) + " (what moelab models)")
        return value


_TYPE_NAMES = {int: "a JSON integer", float: "a JSON number", bool: "true or false", str: "a JSON string",
               dict: "a JSON object"}


def _gated(f: _Fields) -> str:
    f.choice("hidden_act", ("silu",), "silu")
    return "swiglu"


def _mixtral(f: _Fields) -> dict:
    return dict(hidden=f.get("hidden_size", int), ffn=f.get("intermediate_size", int),
                experts=f.get("num_local_experts", int), top_k=f.get("num_experts_per_tok", int),
                gate="softmax_topk_renorm", activation=_gated(f), bias=False)


def _qwen3_moe(f: _Fields) -> dict:
    norm = f.get("norm_topk_prob", bool, False)
    return dict(hidden=f.get("hidden_size", int), ffn=f.get("moe_intermediate_size", int),
                experts=f.get("num_experts", int), top_k=f.get("num_experts_per_tok", int),
                gate="softmax_topk_renorm" if norm else "softmax_topk", activation=_gated(f), bias=False)


def _deepseek(f: _Fields, v3: bool) -> dict:
    layer = dict(hidden=f.get("hidden_size", int), ffn=f.get("moe_intermediate_size", int),
                 experts=f.get("n_routed_experts", int), top_k=f.get("num_experts_per_tok", int),
                 shared_experts=f.get("n_shared_experts", int, 0),
                 routed_scaling=f.get("routed_scaling_factor", float, 1.0), activation=_gated(f), bias=False)
    if v3:
        f.choice("scoring_func", ("sigmoid",), "sigmoid")
        f.choice("topk_method", ("noaux_tc",), "noaux_tc")
        f.choice("norm_topk_prob", (True,), True)
        return dict(layer, gate="sigmoid_bias", n_group=f.get("n_group", int, 1),
                    topk_group=f.get("topk_group", int, 1))
    f.choice("scoring_func", ("softmax",), "softmax")
    method = f.choice("topk_method", ("greedy", "group_limited_greedy"), "greedy")
    groups = dict(n_group=f.get("n_group", int), topk_group=f.get("topk_group", int)) \
        if method == "group_limited_greedy" else {}
    return dict(layer, gate="softmax_topk", **groups)


def _llama4(f: _Fields) -> dict:
    return dict(hidden=f.get("hidden_size", int), ffn=f.get("intermediate_size", int),
                experts=f.get("num_local_experts", int),
                top_k=f.get("num_experts_per_tok", int), gate="sigmoid_topk", scale_before_expert=True,
                shared_experts=1, activation=_gated(f), bias=False)


def _gpt_oss(f: _Fields) -> dict:
    return dict(hidden=f.get("hidden_size", int), ffn=f.get("intermediate_size", int),
                experts=f.get("num_local_experts", int),
                top_k=f.get("num_experts_per_tok", int, None, "experts_per_token"),
                gate="topk_softmax", router_bias=True, activation="swiglu_oai",
                swiglu_limit=f.get("swiglu_limit", float), bias=True)


def layer_fields(path: str, d) -> dict:
    """The layer's Config fields from the parsed config.json `d` (read from `path`)."""
    if not isinstance(d, dict):
        raise ConfigError(path, d, "a JSON object (a Hugging Face config.json)")
    family = _Fields(path, d, "a Hugging Face model").get("model_type", str)
    if family not in FAMILIES:
        raise ConfigError(f"{path}: model_type", family, "one of " + ", ".join(FAMILIES) + " (the MoE families "
                          "moelab maps)")
    f = _Fields(path, d, family)
    if family == "llama4":
        f = _Fields(path, f.get("text_config", dict), family, "text_config.")
    if family in ("llama4", "llama4_text"):
        return _llama4(f)
    if family in ("deepseek_v2", "deepseek_v3"):
        return _deepseek(f, family == "deepseek_v3")
    return {"mixtral": _mixtral, "qwen3_moe": _qwen3_moe, "gpt_oss": _gpt_oss}[family](f)


def from_hf(path: str | Path, **run) -> Config:
    """The Config of the MoE layer in the Hugging Face config.json at `path`, run as DEFAULTS
    says with `run` (tokens, ranks, ...) over them; named after the file's folder."""
    path = Path(path)
    d = read_json(path, "a Hugging Face config.json: a JSON object of the model's fields")
    layer = layer_fields(str(path), d)
    name = (path.parent.name or path.stem) if path.name == "config.json" else path.stem
    try:
        return Config(name=name, **{**DEFAULTS, **layer, **run})
    except ConfigError as e:
        raise ConfigError(f"{path}: {e.field}", e.value, e.allowed) from e
