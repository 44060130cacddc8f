"""Motif-3's attention (Motif Technologies 2026; grouped differential latent attention, GDLA) in the released
checkpoint's layout ↔ :class:`~diffattn.layers.GroupedLatentDiffAttention`, one layer at a time, exactly, both ways.

The layout is the one llama.cpp's Motif-3 converter reads (``conversion/motif3.py``, ``src/models/motif3.cpp``):

- ``config.json``: ``hidden_size``, ``num_attention_heads`` (signal + noise query heads), ``num_noise_heads``,
  ``num_key_value_heads``, ``q_lora_rank``, ``kv_lora_rank``, ``head_dim`` (qk_nope + qk_rope), ``qk_rope_head_dim``,
  ``v_head_dim``, ``rms_norm_eps``, ``rope_theta``; interleaved sliding-window layers with ``use_sliding_window``,
  ``sliding_window`` (W: a query sees itself and the W keys before it), ``sliding_window_pattern``
  (``"interleave"``), ``sliding_window_period`` (p, default 2: layer l uses full attention when l % p == 0, the
  others the window) and ``swa_rope_theta`` (their RoPE base); ``rope_scaling`` / ``rope_factor`` (YaRN).
- tensors under ``model.layers.{l}.self_attn.``: ``wq_a``, ``q_norm``, ``wq_b``, ``wq_b_gate`` (the output gate;
  optional), ``wkv_a``, ``kv_norm``, ``wkv_b``, ``lambda_proj``, ``wo`` (``.weight`` each, no biases).

The layer's parameters are those tensors under other names, no tensor permuted or split (``wq_b``'s heads are
[nope | rope] each, in groups [signal × r, noise], as the layer reads them): a converted state dict written back is
bit-identical, and tensors keep their dtype.

Not supported (this module converts the attention of one layer, nothing else): YaRN-scaled RoPE (a ``rope_factor``
> 1 is refused, not approximated), the MoE feed-forward layers (grouped-PolyNorm experts, router, shared expert),
the dense PolyNorm MLP (its sigmoid-weighted, clamped PolyNorm is not :class:`~diffattn.layers.PolyNormGLU`), the mHC
hyper-connections around every sub-layer, the multi-token-prediction layers, and so the full decoder model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..layers import AttentionSpec, GroupedLatentDiffAttention
from ._common import StateDict, check_no_extra, take

__all__ = ["MOTIF3_ATTENTION_NAMES", "motif3_is_sliding", "motif3_attention_spec", "motif3_to_diffattn_attention",
           "diffattn_to_motif3_attention", "from_motif3_attention", "to_motif3_attention"]

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


def motif3_attention_spec(config: Mapping, layer: int, *, output_gate: bool = True,
                          backend: str = "auto") -> tuple[AttentionSpec, int, int]:
    """(spec, dim, num_heads) of layer ``layer``'s attention from a Motif-3 ``config.json`` (a dict): the
    sliding-window layers get ``sliding_window`` = W + 1 and ``swa_rope_theta``; ``output_gate`` says whether the
    checkpoint holds ``wq_b_gate``. ValueError for what the layer cannot compute exactly (YaRN scaling)."""
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be the dict of a Motif-3 config.json, got {type(config).__name__}")
    scaling = _get(config, "rope_scaling", {}) or {}
    factor = float(scaling.get("factor", _get(config, "rope_factor", 1.0)) or 1.0)
    if factor > 1.0:
        raise ValueError(f"config asks for YaRN-scaled RoPE (factor {factor}) on the full-attention layers; "
                         f"diffattn's GDLA layer has plain RoPE only and converts only an unscaled config")
    h = int(_get(config, "num_attention_heads", required=True))
    head_dim = int(_get(config, "head_dim", required=True))
    rope = int(_get(config, "qk_rope_head_dim", required=True))
    sliding = motif3_is_sliding(config, layer)
    theta = float(_get(config, "rope_theta", 10000.0))
    if sliding:
        theta = float(_get(config, "swa_rope_theta", theta))
    spec = AttentionSpec(
        "gdla", num_kv_heads=int(_get(config, "num_key_value_heads", required=True)),
        q_lora_rank=int(_get(config, "q_lora_rank", required=True)),
        kv_lora_rank=int(_get(config, "kv_lora_rank", required=True)),
        qk_nope_head_dim=head_dim - rope, qk_rope_head_dim=rope,
        v_head_dim=int(_get(config, "v_head_dim", required=True)),
        num_noise_heads=int(_get(config, "num_noise_heads", required=True)), output_gate=bool(output_gate),
        norm_eps=float(_get(config, "rms_norm_eps", 1e-6)), rope="half", rope_theta=theta, causal=True,
        sliding_window=int(config["sliding_window"]) + 1 if sliding else None, backend=backend)
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
