"""Motif-3 (Motif Technologies 2026) in the released checkpoint's layout ↔ diffattn's layers, one layer at a time,
exactly, both ways: the attention (grouped differential latent attention, GDLA) of every layer ↔
:class:`~diffattn.layers.GroupedLatentDiffAttention`, and the MLP of a dense layer ↔
:class:`~diffattn.layers.Motif3PolyNormGLU`.

The layout is the one llama.cpp's Motif-3 converter reads (``conversion/motif3.py``, ``src/models/motif3.cpp``):

- ``config.json``: ``hidden_size``, ``num_attention_heads`` (signal + noise query heads), ``num_noise_heads``,
  ``num_key_value_heads``, ``q_lora_rank``, ``kv_lora_rank``, ``head_dim`` (qk_nope + qk_rope), ``qk_rope_head_dim``,
  ``v_head_dim``, ``rms_norm_eps``, ``rope_theta``; interleaved sliding-window layers with ``use_sliding_window``,
  ``sliding_window`` (W: a query sees itself and the W keys before it), ``sliding_window_pattern``
  (``"interleave"``), ``sliding_window_period`` (p, default 2: layer l uses full attention when l % p == 0, the
  others the window) and ``swa_rope_theta`` (their RoPE base); YaRN on the full-attention layers when its factor
  f > 1: ``rope_scaling`` {``factor``, ``original_max_position_embeddings``, ``beta_fast`` (default 32),
  ``beta_slow`` (1), ``mscale`` (1)}, or the top-level ``rope_factor``, ``original_seq_len`` (default 32768) and
  ``mscale`` llama.cpp's converter falls back to. ``mscale_all_dim`` is not read: llama.cpp's graph keeps the cos/sin
  tables of magnitude 1 and puts (1 + 0.1 · mscale · ln f)² on the softmax scale of the full layers
  (:class:`~diffattn.layers.GroupedLatentDiffAttention`'s ``yarn_*`` settings); the sliding-window layers keep plain
  RoPE with ``swa_rope_theta`` and the plain scale.
- for the MLP: ``intermediate_size``, ``polynorm_sigmoid_weight`` (default true), ``polynorm_output_scale`` (1.0),
  ``hidden_clamp`` (unset: no clamp; llama.cpp clamps only when it is > 0), ``polynorm_bias_clamp`` (routed experts
  only); PolyNorm's eps is not in ``config.json`` (1e-6). Which layers are dense: all when ``num_experts`` is 0 or
  absent, else those with l < ``n_dense_first_layers`` (default 0) or (l + 1) % ``interleave_moe_layer_step``
  (default 1) != 0.
- tensors under ``model.layers.{l}.self_attn.``: ``wq_a``, ``q_norm``, ``wq_b``, ``wq_b_gate`` (the output gate;
  optional), ``wkv_a``, ``kv_norm``, ``wkv_b``, ``lambda_proj``, ``wo`` (``.weight`` each, no biases); under
  ``model.layers.{l}.mlp.`` of a dense layer: ``gate_proj.weight``, ``up_proj.weight``, ``down_proj.weight``,
  ``act_fn.weight`` (3 PolyNorm coefficients), ``act_fn.bias`` (1).

The layers' parameters are those tensors under other names (the MLP's under the same names), no tensor permuted or
split (``wq_b``'s heads are [nope | rope] each, in groups [signal × r, noise], as the layer reads them): a converted
state dict written back is bit-identical, and tensors keep their dtype.

Supported: the attention of every layer (full and sliding-window, with or without YaRN) and the MLP of the dense
layers. Not supported: a ``rope_scaling`` of another type than YaRN, or a YaRN ``extrapolation_factor`` other than 1
(refused, not approximated); the MoE feed-forward layers
(the routed grouped-PolyNorm experts, the router and its expert bias, the shared expert: asking for the MLP of an MoE
layer is refused); the mHC hyper-connections around every sub-layer; the multi-token-prediction layers; the norms,
embeddings and head; and so the full decoder model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..layers import AttentionSpec, GroupedLatentDiffAttention, Motif3PolyNormGLU
from ._common import StateDict, check_no_extra, take

__all__ = ["MOTIF3_ATTENTION_NAMES", "motif3_is_sliding", "motif3_yarn_settings", "motif3_attention_spec",
           "motif3_to_diffattn_attention", "diffattn_to_motif3_attention", "from_motif3_attention",
           "to_motif3_attention",
           "MOTIF3_MLP_NAMES", "motif3_is_dense", "motif3_mlp_settings", "motif3_mlp_config", "motif3_to_diffattn_mlp",
           "diffattn_to_motif3_mlp", "from_motif3_mlp", "to_motif3_mlp"]

#: released name under ``model.layers.{l}.self_attn.`` → the layer's parameter name
MOTIF3_ATTENTION_NAMES = {
    "wq_a.weight": "q_a_proj.weight",
    "q_norm.weight": "q_a_norm.weight",
    "wq_b.weight": "q_b_proj.weight",
    "wq_b_gate.weight": "gate_proj.weight",
    "wkv_a.weight": "kv_a_proj.weight",
    "kv_norm.weight": "kv_a_norm.weight",
    "wkv_b.weight": "kv_b_proj.weight",
    "lambda_proj.weight": "lambda_proj.weight",
    "wo.weight": "out_proj.weight",
}
_GATE = "wq_b_gate.weight"

#: released name under ``model.layers.{l}.mlp.`` of a dense layer → the :class:`~diffattn.layers.Motif3PolyNormGLU`
#: parameter name (the same)
MOTIF3_MLP_NAMES = {name: name for name in ("gate_proj.weight", "up_proj.weight", "down_proj.weight",
                                            "act_fn.weight", "act_fn.bias")}
_POLY_NORM_EPS = 1e-6  # PolyNorm's eps: not in config.json, llama.cpp's converter writes 1e-6


def _get(config: Mapping, key: str, default: Any = None, *, required: bool = False) -> Any:
    if key not in config or config[key] is None:
        if required:
            raise ValueError(f"Motif-3 config.json has no {key!r}")
        return default
    return config[key]


def _prefix(layer: int) -> str:
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        raise ValueError(f"layer must be an integer >= 0 (the 0-based layer index), got {layer!r}")
    return f"model.layers.{layer}.self_attn."


def motif3_is_sliding(config: Mapping, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) of a Motif-3 ``config.json`` uses the sliding window: with
    ``use_sliding_window``, every layer but those with layer % ``sliding_window_period`` == 0 (llama.cpp's
    ``set_swa_pattern(period, dense_first=true)``)."""
    _prefix(layer)
    if not _get(config, "use_sliding_window", False) or _get(config, "sliding_window") is None:
        return False
    pattern = _get(config, "sliding_window_pattern", "interleave")
    if pattern != "interleave":
        raise ValueError(f"config.sliding_window_pattern must be 'interleave', got {pattern!r}")
    period = int(_get(config, "sliding_window_period", 2))
    if period < 1:
        raise ValueError(f"config.sliding_window_period must be an integer >= 1, got {period}")
    return layer % period != 0


def motif3_yarn_settings(config: Mapping) -> dict[str, Any]:
    """The :class:`~diffattn.layers.GroupedLatentDiffAttention` ``yarn_*`` settings of a Motif-3 ``config.json``'s
    full-attention layers, read as llama.cpp's converter and graph read them (module docstring); {} when the config
    does not scale RoPE (factor absent or <= 1). ValueError for a scaling the layer does not compute."""
    scaling = _get(config, "rope_scaling", {}) or {}
    if not isinstance(scaling, Mapping):
        raise ValueError(f"config.rope_scaling must be a dict or null, got {scaling!r}")
    factor = float(scaling.get("factor", _get(config, "rope_factor", 1.0)) or 1.0)
    if factor <= 1.0:
        return {}
    kind = scaling.get("rope_type", scaling.get("type", "yarn"))
    if kind != "yarn":
        raise ValueError(f"config.rope_scaling asks for RoPE scaling {kind!r} (factor {factor}); Motif-3's layers "
                         f"compute YaRN only ('yarn')")
    ext = scaling.get("extrapolation_factor")
    if ext is not None and float(ext) != 1.0:
        raise ValueError(f"config.rope_scaling.extrapolation_factor must be 1 (YaRN's full ramp, as llama.cpp "
                         f"runs it), got {ext!r}")
    original = scaling.get("original_max_position_embeddings", _get(config, "original_seq_len", 32768))
    mscale = scaling.get("mscale", _get(config, "mscale", 1.0))
    return {"yarn_factor": factor, "yarn_original_context": int(original),
            "yarn_beta_fast": float(scaling.get("beta_fast") or 32.0),
            "yarn_beta_slow": float(scaling.get("beta_slow") or 1.0),
            "yarn_mscale": float(1.0 if mscale is None else mscale)}


def motif3_attention_spec(config: Mapping, layer: int, *, output_gate: bool = True,
                          backend: str = "auto") -> tuple[AttentionSpec, int, int]:
    """(spec, dim, num_heads) of layer ``layer``'s attention from a Motif-3 ``config.json`` (a dict): the
    sliding-window layers get ``sliding_window`` = W + 1 and ``swa_rope_theta``, the full-attention layers YaRN
    when the config scales RoPE (:func:`motif3_yarn_settings`); ``output_gate`` says whether the checkpoint holds
    ``wq_b_gate``. ValueError for what the layer cannot compute exactly."""
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be the dict of a Motif-3 config.json, got {type(config).__name__}")
    yarn = motif3_yarn_settings(config)
    h = int(_get(config, "num_attention_heads", required=True))
    head_dim = int(_get(config, "head_dim", required=True))
    rope = int(_get(config, "qk_rope_head_dim", required=True))
    sliding = motif3_is_sliding(config, layer)
    theta = float(_get(config, "rope_theta", 10000.0))
    if sliding:  # llama.cpp: the sliding-window layers rotate with swa_rope_theta and no YaRN
        theta = float(_get(config, "swa_rope_theta", theta))
        yarn = {}
    spec = AttentionSpec(
        "gdla", num_kv_heads=int(_get(config, "num_key_value_heads", required=True)),
        q_lora_rank=int(_get(config, "q_lora_rank", required=True)),
        kv_lora_rank=int(_get(config, "kv_lora_rank", required=True)),
        qk_nope_head_dim=head_dim - rope, qk_rope_head_dim=rope,
        v_head_dim=int(_get(config, "v_head_dim", required=True)),
        num_noise_heads=int(_get(config, "num_noise_heads", required=True)), output_gate=bool(output_gate),
        norm_eps=float(_get(config, "rms_norm_eps", 1e-6)), rope="half", rope_theta=theta, causal=True,
        sliding_window=int(config["sliding_window"]) + 1 if sliding else None, backend=backend, **yarn)
    return spec, int(_get(config, "hidden_size", required=True)), h


def motif3_to_diffattn_attention(sd: StateDict, layer: int) -> dict[str, torch.Tensor]:
    """The attention tensors of layer ``layer`` in a released state dict (other layers' and other modules' keys are
    ignored) → the layer's state dict (tensors shared, not copied). Every required tensor must be there."""
    p = _prefix(layer)
    out = {}
    for theirs, ours in MOTIF3_ATTENTION_NAMES.items():
        if theirs == _GATE and p + theirs not in sd:
            continue
        out[ours] = take(sd, p + theirs, "Motif-3 checkpoint", ndim=1 if "norm" in theirs else 2)
    return out


def diffattn_to_motif3_attention(sd: StateDict, layer: int) -> dict[str, torch.Tensor]:
    """A :class:`~diffattn.layers.GroupedLatentDiffAttention` state dict → the released names of layer ``layer``
    (tensors shared, not copied); any key the layout has no name for is an error."""
    p = _prefix(layer)
    ours = {v: k for k, v in MOTIF3_ATTENTION_NAMES.items()}
    check_no_extra(sd, set(ours), "GDLA layer")
    out = {}
    for name, theirs in ours.items():
        if theirs == _GATE and name not in sd:
            continue
        out[p + theirs] = take(sd, name, "GDLA layer")
    return out


def from_motif3_attention(config: Mapping, sd: StateDict, layer: int, *,
                          backend: str = "auto") -> GroupedLatentDiffAttention:
    """Layer ``layer``'s attention of a released Motif-3 (its ``config.json`` dict and a state dict holding that
    layer's tensors) as a :class:`~diffattn.layers.GroupedLatentDiffAttention` in the tensors' dtype, loaded
    strictly."""
    weights = motif3_to_diffattn_attention(sd, layer)
    spec, dim, h = motif3_attention_spec(config, layer, output_gate="gate_proj.weight" in weights, backend=backend)
    dtype = weights["q_a_proj.weight"].dtype
    with torch.device("meta"):
        module = GroupedLatentDiffAttention(dim, h, spec, depth=layer)
    want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if want != got:
        bad = {k: (got.get(k), want.get(k)) for k in sorted(set(want) | set(got)) if got.get(k) != want.get(k)}
        raise ValueError(f"Motif-3 layer {layer}: tensor shapes (got, config.json wants): {bad}")
    module = module.to_empty(device=weights["q_a_proj.weight"].device).to(dtype)
    module.load_state_dict(weights, strict=True)
    return module


def to_motif3_attention(module: GroupedLatentDiffAttention, layer: int) -> dict[str, torch.Tensor]:
    """A GDLA layer's weights under the released names of layer ``layer`` (:func:`diffattn_to_motif3_attention`)."""
    if not isinstance(module, GroupedLatentDiffAttention):
        raise ValueError(f"module must be a diffattn GroupedLatentDiffAttention, got {type(module).__name__}")
    return diffattn_to_motif3_attention(module.state_dict(), layer)


def _mlp_prefix(layer: int) -> str:
    return _prefix(layer).replace(".self_attn.", ".mlp.")


def motif3_is_dense(config: Mapping, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) of a Motif-3 ``config.json`` has a dense MLP rather than MoE experts
    (llama.cpp's ``is_moe``: ``num_experts`` > 0, layer >= ``n_dense_first_layers`` and (layer + 1) %
    ``interleave_moe_layer_step`` == 0)."""
    _prefix(layer)
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be the dict of a Motif-3 config.json, got {type(config).__name__}")
    if int(_get(config, "num_experts", 0)) <= 0:
        return True
    lead = int(_get(config, "n_dense_first_layers", 0))
    step = int(_get(config, "interleave_moe_layer_step", 1))
    return not (layer >= lead and step > 0 and (layer + 1) % step == 0)


def motif3_mlp_settings(config: Mapping, layer: int) -> dict[str, Any]:
    """The :class:`~diffattn.layers.Motif3PolyNormGLU` arguments of dense layer ``layer`` from a Motif-3
    ``config.json`` (a dict); ValueError for an MoE layer, whose experts and router diffattn does not build."""
    if not motif3_is_dense(config, layer):
        raise ValueError(
            f"layer {layer} of this config is an MoE layer (num_experts={config['num_experts']}, "
            f"n_dense_first_layers={_get(config, 'n_dense_first_layers', 0)}, interleave_moe_layer_step="
            f"{_get(config, 'interleave_moe_layer_step', 1)}); diffattn converts only the MLP of dense layers, not "
            f"the MoE experts and router")
    sigmoid_weight = _get(config, "polynorm_sigmoid_weight", True)
    if not isinstance(sigmoid_weight, bool):
        raise ValueError(f"config.polynorm_sigmoid_weight must be a bool, got {sigmoid_weight!r}")
    clamp = _get(config, "hidden_clamp")
    clamp = float(clamp) if clamp is not None and float(clamp) > 0 else None  # llama.cpp: applied when > 0
    return dict(dim=int(_get(config, "hidden_size", required=True)),
                hidden_dim=int(_get(config, "intermediate_size", required=True)), eps=_POLY_NORM_EPS,
                sigmoid_weight=sigmoid_weight, output_scale=float(_get(config, "polynorm_output_scale", 1.0)),
                hidden_clamp=clamp)


def motif3_mlp_config(module: Motif3PolyNormGLU) -> dict[str, Any]:
    """The ``config.json`` entries that give back ``module``'s settings through :func:`motif3_mlp_settings`
    (``hidden_size``, ``intermediate_size``, ``polynorm_sigmoid_weight``, ``polynorm_output_scale``,
    ``hidden_clamp``: None when unset). ValueError for what the layout cannot express (an eps other than 1e-6)."""
    if not isinstance(module, Motif3PolyNormGLU):
        raise ValueError(f"module must be a diffattn Motif3PolyNormGLU, got {type(module).__name__}")
    if module.act_fn.eps != _POLY_NORM_EPS:
        raise ValueError(f"module's PolyNorm eps is {module.act_fn.eps}; Motif-3's layout fixes {_POLY_NORM_EPS}")
    return {"hidden_size": module.gate_proj.in_features, "intermediate_size": module.gate_proj.out_features,
            "polynorm_sigmoid_weight": module.act_fn.sigmoid_weight, "polynorm_output_scale": module.output_scale,
            "hidden_clamp": module.hidden_clamp}


def motif3_to_diffattn_mlp(sd: StateDict, layer: int) -> dict[str, torch.Tensor]:
    """The dense MLP tensors of layer ``layer`` in a released state dict (other layers' and other modules' keys are
    ignored) → the module's state dict (tensors shared, not copied). Every tensor must be there."""
    p = _mlp_prefix(layer)
    return {ours: take(sd, p + theirs, "Motif-3 checkpoint", ndim=1 if theirs.startswith("act_fn.") else 2)
            for theirs, ours in MOTIF3_MLP_NAMES.items()}


def diffattn_to_motif3_mlp(sd: StateDict, layer: int) -> dict[str, torch.Tensor]:
    """A :class:`~diffattn.layers.Motif3PolyNormGLU` state dict → the released names of layer ``layer`` (tensors
    shared, not copied); any key the layout has no name for is an error."""
    p = _mlp_prefix(layer)
    check_no_extra(sd, set(MOTIF3_MLP_NAMES.values()), "Motif-3 MLP")
    return {p + theirs: take(sd, ours, "Motif-3 MLP") for theirs, ours in MOTIF3_MLP_NAMES.items()}


def from_motif3_mlp(config: Mapping, sd: StateDict, layer: int) -> Motif3PolyNormGLU:
    """Dense layer ``layer``'s MLP of a released Motif-3 (its ``config.json`` dict and a state dict holding that
    layer's tensors) as a :class:`~diffattn.layers.Motif3PolyNormGLU` holding the checkpoint's tensors themselves
    (each keeps its dtype: the PolyNorm coefficients are often float32 beside bfloat16 projections), loaded
    strictly."""
    weights = motif3_to_diffattn_mlp(sd, layer)
    settings = motif3_mlp_settings(config, layer)
    with torch.device("meta"):
        module = Motif3PolyNormGLU(**settings)
    want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if want != got:
        bad = {k: (got[k], want[k]) for k in sorted(want) if got[k] != want[k]}
        raise ValueError(f"Motif-3 layer {layer} MLP: tensor shapes (got, config.json wants): {bad}")
    module.load_state_dict(weights, strict=True, assign=True)
    return module


def to_motif3_mlp(module: Motif3PolyNormGLU, layer: int) -> dict[str, torch.Tensor]:
    """A dense MLP's weights under the released names of layer ``layer`` (:func:`diffattn_to_motif3_mlp`); the
    ``config.json`` entries it needs come from :func:`motif3_mlp_config`."""
    if not isinstance(module, Motif3PolyNormGLU):
        raise ValueError(f"module must be a diffattn Motif3PolyNormGLU, got {type(module).__name__}")
    return diffattn_to_motif3_mlp(module.state_dict(), layer)
