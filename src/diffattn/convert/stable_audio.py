"""Stable Audio 3's differential attention (Stability AI 2026, arXiv 2605.17991): Stability's fused projection ↔
diffusers', and diffusers' attention modules ↔ :class:`~diffattn.layers.StableAudioAttention`, exactly.

**Layouts of the fused self-attention projection** ``to_qkv`` (dim → 5·dim, no bias), each part h heads of width d:

    diffusers (``StableAudio3SelfAttention``)      [q1 | q2 | k1 | k2 | v]
    Stability (stable-audio-tools' ``Attention``)  [q | k | v | q_diff | k_diff]   (q1 = q, q2 = q_diff, …)

stable-audio-tools computes ``attn(q, k, v) − attn(q_diff, k_diff, v)``: its ``q`` / ``k`` make the first (added)
map and ``q_diff`` / ``k_diff`` the second (subtracted) one, as ``q1`` / ``k1`` and ``q2`` / ``k2`` do in diffusers.
Cross-attention is laid out the same way on both sides (``to_q`` = [q1 | q2], ``to_kv`` = [k1 | k2 | v]), so only
``to_qkv`` is permuted: :func:`stability_to_diffusers_qkv`, :func:`diffusers_to_stability_qkv`, and their state-dict
forms, which permute every differential ``to_qkv.weight`` (5·dim rows) under any prefix and pass every other key.

**Modules ↔ layer.** ``StableAudio3SelfAttention(dim, dim_heads=d)`` and ``StableAudio3CrossAttention(dim,
context_dim, dim_heads=d)`` (``use_differential=True``) map onto ``StableAudioAttention(dim, dim // d,
qkv_bias=False, out_bias=False)``, self-attention with ``rope="half"`` (the DiT rotates the first d/2 channels of
each head with θ_m = 10000^(−2m/(d/2)): ``rotary_fraction=0.5``), cross-attention with ``context_dim`` and no
rotary embedding. The layer holds the library's adjacent pairing (design notes §2), so the rows of the branches are
interleaved head by head:

    q_proj rows of head i = [q1_i ; q2_i],   k_proj rows of head i = [k1_i ; k2_i],   v_proj = v,   out_proj = to_out
    q_norm.weight = q_norm.gamma,   k_norm.weight = k_norm.gamma

:func:`from_diffusers_stable_audio` and :func:`to_diffusers_stable_audio` convert both ways (a round trip gives the
same tensors bit for bit). diffusers computes the QK-norm and the rotation in float32 whatever the input's dtype;
the layer computes them in float32, or float64 for a float64 layer: in float32 the two agree to rounding, in float64
the layer is the more precise of the two.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn as nn

from ..layers import StableAudioAttention

__all__ = [
    "stability_to_diffusers_qkv",
    "diffusers_to_stability_qkv",
    "stability_to_diffusers_state_dict",
    "diffusers_to_stability_state_dict",
    "from_diffusers_stable_audio",
    "to_diffusers_stable_audio",
]

StateDict = Mapping[str, torch.Tensor]
#: where the parts of ``to_qkv`` sit: diffusers [q1, q2, k1, k2, v], Stability [q, k, v, q_diff, k_diff]
_DIFFUSERS_FROM_STABILITY = (0, 3, 1, 4, 2)  # diffusers part j is Stability part _DIFFUSERS_FROM_STABILITY[j]
_STABILITY_FROM_DIFFUSERS = (0, 2, 4, 1, 3)


def _check_qkv(weight: torch.Tensor, where: str) -> None:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != 5 * weight.shape[1]:
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"{where} must be a differential to_qkv weight of shape (5·dim, dim), got {got}")


def _reorder(weight: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    parts = weight.chunk(5, dim=0)
    return torch.cat([parts[i] for i in order], dim=0)


def stability_to_diffusers_qkv(weight: torch.Tensor) -> torch.Tensor:
    """Stability's ``to_qkv`` weight [q, k, v, q_diff, k_diff] → diffusers' [q1 | q2 | k1 | k2 | v] (a new tensor)."""
    _check_qkv(weight, "weight")
    return _reorder(weight, _DIFFUSERS_FROM_STABILITY)


def diffusers_to_stability_qkv(weight: torch.Tensor) -> torch.Tensor:
    """diffusers' ``to_qkv`` weight [q1 | q2 | k1 | k2 | v] → Stability's [q, k, v, q_diff, k_diff] (a new tensor)."""
    _check_qkv(weight, "weight")
    return _reorder(weight, _STABILITY_FROM_DIFFUSERS)


def _convert_state_dict(sd: StateDict, fn) -> dict[str, torch.Tensor]:
    if not isinstance(sd, Mapping):
        raise ValueError(f"state_dict must be a mapping of names to tensors, got {type(sd).__name__}")
    out = {}
    for key, value in sd.items():
        differential = (key == "to_qkv.weight" or key.endswith(".to_qkv.weight")) and isinstance(value, torch.Tensor) \
            and value.dim() == 2 and value.shape[0] == 5 * value.shape[1]
        out[key] = fn(value) if differential else value
    return out


def stability_to_diffusers_state_dict(sd: StateDict) -> dict[str, torch.Tensor]:
    """Every differential ``to_qkv.weight`` (5·dim rows, under any prefix) of ``sd`` from Stability's layout to
    diffusers' (:func:`stability_to_diffusers_qkv`); every other entry passed through unchanged. Keys are not
    renamed."""
    return _convert_state_dict(sd, stability_to_diffusers_qkv)


def diffusers_to_stability_state_dict(sd: StateDict) -> dict[str, torch.Tensor]:
    """The inverse of :func:`stability_to_diffusers_state_dict`."""
    return _convert_state_dict(sd, diffusers_to_stability_qkv)


# ------------------------------------------------------------------------------------------- modules ↔ layer

def _pair_heads(first: torch.Tensor, second: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of two projections (h·d, D) → one (2h·d, D) whose head pair (2i, 2i+1) is (first_i, second_i)."""
    D = first.shape[-1]
    return torch.stack([first.view(-1, head_dim, D), second.view(-1, head_dim, D)], dim=1).reshape(-1, D)


def _unpair_heads(weight: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`_pair_heads`."""
    D = weight.shape[-1]
    pairs = weight.view(-1, 2, head_dim, D)
    return pairs[:, 0].reshape(-1, D), pairs[:, 1].reshape(-1, D)


def _is_cross(module: nn.Module) -> bool:
    if hasattr(module, "to_qkv"):
        return False
    if hasattr(module, "to_q") and hasattr(module, "to_kv"):
        return True
    raise ValueError(f"module must be diffusers' StableAudio3SelfAttention or StableAudio3CrossAttention, got "
                     f"{type(module).__name__}")


def from_diffusers_stable_audio(module: nn.Module, *, backend: str = "auto") -> StableAudioAttention:
    """diffusers' ``StableAudio3SelfAttention`` or ``StableAudio3CrossAttention`` (``use_differential=True``) →
    :class:`~diffattn.layers.StableAudioAttention` computing the same function (module docstring): self-attention
    with SA3's partial rotary embedding (call it as the module: ``layer(x)``), cross-attention with the module's
    context width (``layer(x, context=c, attn_mask=mask[:, None, None, :])``). The weights are copied, in the
    module's dtype and device; ``backend`` is the layer's."""
    cross = _is_cross(module)
    if not getattr(module, "use_differential", False):
        raise ValueError(f"{type(module).__name__} has use_differential=False: plain attention, not Stable Audio 3's "
                         f"differential attention")
    d, h = int(module.dim_heads), int(module.heads)
    dim = module.to_out.out_features
    if dim != h * d:
        raise ValueError(f"{type(module).__name__} has heads={h} of width dim_heads={d} but to_out of width {dim}")
    if module.q_norm.eps != module.k_norm.eps:
        raise ValueError(f"the layer has one QK-norm epsilon; module has q_norm.eps={module.q_norm.eps} and "
                         f"k_norm.eps={module.k_norm.eps}")
    if cross:
        settings = dict(rope=None, context_dim=int(module.to_kv.in_features))
    else:
        if (d // 2) % 2:
            raise ValueError(f"the DiT's rotary embedding of head width dim_heads={d} has an odd d/2 = {d // 2} "
                             f"(frequencies the layer's rotary embedding cannot give); dim_heads must be a multiple "
                             f"of 4")
        settings = dict(rope="half", rotary_fraction=0.5)
    layer = StableAudioAttention(dim, h, qkv_bias=False, out_bias=False, qk_norm_eps=float(module.q_norm.eps),
                                 backend=backend, **settings)
    if cross:
        q1, q2 = module.to_q.weight.chunk(2, dim=0)
        k1, k2, v = module.to_kv.weight.chunk(3, dim=0)
    else:
        q1, q2, k1, k2, v = module.to_qkv.weight.chunk(5, dim=0)
    sd = {"q_proj.weight": _pair_heads(q1, q2, d), "k_proj.weight": _pair_heads(k1, k2, d),
          "v_proj.weight": v.clone(), "out_proj.weight": module.to_out.weight.clone(),
          "q_norm.weight": module.q_norm.gamma.clone(), "k_norm.weight": module.k_norm.gamma.clone()}
    layer.load_state_dict(sd, strict=True, assign=True)
    return layer.train(module.training)


def to_diffusers_stable_audio(layer: StableAudioAttention, *, cross: bool = False) -> nn.Module:
    """:class:`~diffattn.layers.StableAudioAttention` → diffusers' ``StableAudio3SelfAttention`` (``cross=False``)
    or ``StableAudio3CrossAttention`` (``cross=True``; needed where the layer's ``context_dim`` differs from its
    width) with the same weights, in the layer's dtype and device (needs diffusers ≥ 0.40: ``pip install
    'diffattn[audio]'``).

    The layer must be one diffusers can express: no biases, no grouped-query attention, the QK-norm on, no
    soft-capping, sliding window, dropout or causal mask; for self-attention the DiT's rotary embedding
    (``rope="half"``, ``rotary_fraction=0.5``, ``rope_theta=10000``, d/2 even). ValueError naming the first setting
    that is not."""
    if not isinstance(layer, StableAudioAttention):
        raise ValueError(f"layer must be a StableAudioAttention, got {type(layer).__name__}")
    cfg = layer.config
    cross = bool(cross)
    needs = {"qkv_bias": False, "out_bias": False, "qk_norm": True, "softcap": None, "sliding_window": None,
             "causal": False, "attn_drop": 0.0, "proj_drop": 0.0}
    if not cross:
        needs.update(rope="half", rotary_fraction=0.5, rope_theta=10000.0)
    for name, value in needs.items():
        if getattr(cfg, name) != value:
            raise ValueError(f"diffusers' Stable Audio 3 {'cross' if cross else 'self'}-attention needs {name}="
                             f"{value!r}; the layer has {name}={getattr(cfg, name)!r}")
    if layer.num_kv_heads != layer.num_heads:
        raise ValueError(f"diffusers' Stable Audio 3 attention has no grouped-query attention; the layer has "
                         f"num_kv_heads={layer.num_kv_heads} != num_heads={layer.num_heads}")
    d = layer.head_dim
    if not cross and ((d // 2) % 2 or layer.rotary.head_dim != d // 2):
        raise ValueError(f"the DiT rotates d/2 channels with d/2 even; the layer has head width {d}")
    if not cross and layer.context_dim != layer.dim:
        raise ValueError(f"self-attention projects keys and values from x; the layer has context_dim="
                         f"{layer.context_dim} != dim={layer.dim}: convert it with cross=True")
    try:
        from diffusers.models.transformers.transformer_stable_audio3 import (
            StableAudio3CrossAttention,
            StableAudio3SelfAttention,
        )
    except ImportError as e:
        raise ImportError(f"to_diffusers_stable_audio needs diffusers >= 0.40 (StableAudio3DiTModel): pip install "
                          f"'diffattn[audio]' ({e})") from e
    q1, q2 = _unpair_heads(layer.q_proj.weight.detach(), d)
    k1, k2 = _unpair_heads(layer.k_proj.weight.detach(), d)
    v = layer.v_proj.weight.detach()
    if cross:
        module = StableAudio3CrossAttention(layer.dim, layer.context_dim, dim_heads=d, use_differential=True)
        sd = {"to_q.weight": torch.cat([q1, q2]), "to_kv.weight": torch.cat([k1, k2, v])}
    else:
        module = StableAudio3SelfAttention(layer.dim, dim_heads=d, use_differential=True)
        sd = {"to_qkv.weight": torch.cat([q1, q2, k1, k2, v])}
    sd.update({"to_out.weight": layer.out_proj.weight.detach().clone(),
               "q_norm.gamma": layer.q_norm.weight.detach().clone(),
               "k_norm.gamma": layer.k_norm.weight.detach().clone()})
    module.load_state_dict(sd, strict=True, assign=True)
    module.q_norm.eps = module.k_norm.eps = float(cfg.qk_norm_eps)
    return module.train(layer.training)
