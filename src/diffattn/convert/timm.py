"""timm ↔ diffattn, exactly: ``timm.layers.DiffAttention`` layers and timm ``VisionTransformer`` checkpoints.

- **Layer**: ``timm.layers.DiffAttention(dim, num_heads=n)`` counts *differential* heads; it halves the head width
  (head_dim = D/n/2) and views Q/K as 2n heads, pairing 2j and 2j+1, V as n heads of width 2·head_dim: the adjacent
  layout of ``diffattn.DiffAttention(dim, num_heads=2n)``. Only the fused ``qkv`` is split and keys are renamed
  (``proj`` → ``out_proj``, ``sub_norm`` → ``diff_norm``, ``lambda_a/b`` → ``lambda_fn.lambda_a/b`` for
  ``dual_lambda=True``). timm has no GQA and no rotary embedding; its ``qk_norm`` and ``scale_norm`` have no
  counterpart here and are refused.
- **ViT checkpoints**: timm ``vit_*`` (``patch_embed.proj``, ``blocks.i.attn.qkv``, ``attn.proj``) →
  :func:`load_timm_vit` → diffattn's ``vit_*``, sizes read from the tensors' shapes (depth bounded before any
  block is built).
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

from ..lambdas import lambda_init_ye
from ..layers import DiffAttention
from ..models.base import load_state_dict_exact
from ..models.registry import build
from ..models.vit import VisionTransformer
from ._common import (
    LAMBDAS,
    StateDict,
    check_convertible,
    check_no_extra,
    diff_norm_weight,
    take,
    vision_args,
)
from .checkpoint import source_state_dict

__all__ = [
    "timm_to_diffattn_state_dict",
    "diffattn_to_timm_state_dict",
    "from_timm_diff_attention",
    "to_timm_diff_attention",
    "convert_timm_vit_state_dict",
    "load_timm_vit",
]


# ------------------------------------------------------------------------------------------------ layer


def _ye_depth(lambda_init: float) -> int:
    """The 0-based depth whose Ye schedule gives exactly ``lambda_init``, else 0 (recorded as ``depth``)."""
    for k in range(256):
        if lambda_init_ye(k) == lambda_init:
            return k
    return 0


#: timm's names of the ``dual_lambda`` scalars and of the sub-norm weight → ours (the reparameterised λ vectors keep
#: their names on both sides)
_TIMM_NAMES = {"lambda_a": "lambda_fn.lambda_a", "lambda_b": "lambda_fn.lambda_b",
               "sub_norm.weight": "diff_norm.weight"}


def _renamed_lambdas(sd: StateDict, names: dict[str, str], dual_where: str, where: str) -> dict[str, torch.Tensor]:
    """The λ and sub-norm entries of ``sd`` (one side's layout) under the other side's names: ``names`` maps this
    side's two ``dual_lambda`` scalars and sub-norm weight to the other's; without the scalars, the reparameterised
    vectors :data:`LAMBDAS` (a missing one: ValueError naming ``where``)."""
    a, b, norm = names
    if a in sd:
        out = {names[a]: take(sd, a, dual_where).clone(), names[b]: take(sd, b, dual_where).clone()}
    else:
        out = {name: take(sd, name, where).clone() for name in LAMBDAS}
    if norm in sd:
        out[names[norm]] = sd[norm].clone()
    return out


def timm_to_diffattn_state_dict(sd: StateDict) -> dict[str, torch.Tensor]:
    """A ``timm.layers.DiffAttention`` state dict → a :class:`~diffattn.DiffAttention` state dict (same
    layout).

    ``qkv`` (3D, D) splits into ``q_proj``/``k_proj``/``v_proj`` rows [0, D), [D, 2D), [2D, 3D); ``proj`` →
    ``out_proj``; ``sub_norm`` → ``diff_norm``; ``lambda_a/b`` (``dual_lambda``) → ``lambda_fn.lambda_a/b``.
    """
    known = {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", *_TIMM_NAMES, *LAMBDAS}
    bad = sorted(k for k in sd if k.startswith(("q_norm.", "k_norm.", "norm.")))
    if bad:
        raise ValueError(f"timm DiffAttention with qk_norm or scale_norm has no diffattn counterpart "
                         f"(keys {bad})")
    check_no_extra(sd, known, "timm DiffAttention")
    out: dict[str, torch.Tensor] = {}
    for kind in ("weight", "bias"):
        if kind == "weight" or "qkv.bias" in sd:
            parts = take(sd, f"qkv.{kind}", "timm").chunk(3, dim=0)
            for name, t in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                out[f"{name}.{kind}"] = t.clone()
        if kind == "weight" or "proj.bias" in sd:
            out[f"out_proj.{kind}"] = take(sd, f"proj.{kind}", "timm").clone()
    return out | _renamed_lambdas(sd, _TIMM_NAMES, "timm", "timm DiffAttention")


def diffattn_to_timm_state_dict(sd: StateDict, *, qkv_bias: bool | None = None) -> dict[str, torch.Tensor]:
    """A :class:`~diffattn.DiffAttention` state dict → a ``timm.layers.DiffAttention`` state dict (same
    layout).

    timm fuses q/k/v with one bias flag: with ``qkv_bias=True`` (default: True when any of the three has a
    bias) missing biases are filled with zeros. A non-affine ``diff_norm`` gets a ``sub_norm.weight`` of
    ones.
    """
    known = {f"{p}.{k}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for k in ("weight", "bias")}
    known |= {*_TIMM_NAMES.values(), *LAMBDAS}
    check_no_extra(sd, known, "DiffAttention")
    w = [take(sd, f"{p}.weight", "DiffAttention") for p in ("q_proj", "k_proj", "v_proj")]
    out = {"qkv.weight": torch.cat(w, dim=0)}
    has_bias = [f"{p}.bias" in sd for p in ("q_proj", "k_proj", "v_proj")]
    qkv_bias = any(has_bias) if qkv_bias is None else qkv_bias
    if any(has_bias) and not qkv_bias:
        raise ValueError("qkv_bias=False but the state dict has q/k/v biases")
    if qkv_bias:
        out["qkv.bias"] = torch.cat([sd[f"{p}.bias"] if f"{p}.bias" in sd else
                                     torch.zeros(t.shape[0], dtype=t.dtype, device=t.device)
                                     for p, t in zip(("q_proj", "k_proj", "v_proj"), w, strict=True)])
    out["proj.weight"] = take(sd, "out_proj.weight", "DiffAttention").clone()
    if "out_proj.bias" in sd:
        out["proj.bias"] = sd["out_proj.bias"].clone()
    ours = {v: k for k, v in _TIMM_NAMES.items()}
    return out | _renamed_lambdas(sd, ours, "DiffAttention", "DiffAttention")


def from_timm_diff_attention(module: nn.Module, *, backend: str = "auto") -> DiffAttention:
    """A ``timm.layers.DiffAttention(dim, num_heads=n)`` → :class:`~diffattn.DiffAttention` ``(dim, 2n)``.

    λ form (reparam or ``dual_scalar``), λ_init, biases, dropouts, sub-norm eps and weights carry over
    exactly; the result is non-causal (timm takes ``is_causal`` per call; pass ``is_causal=True`` to ours
    the same way).
    """
    from timm.layers import DiffAttention as TimmDiffAttention

    if not isinstance(module, TimmDiffAttention):
        raise ValueError(f"module must be a timm.layers.DiffAttention, got {type(module).__name__}")
    for name in ("q_norm", "k_norm", "norm"):
        if not isinstance(getattr(module, name), nn.Identity):
            raise ValueError(f"timm DiffAttention with {name} (qk_norm / scale_norm) has no diffattn "
                             f"counterpart")
    dim = module.qkv.in_features
    lam = float(module.lambda_init)
    ours = DiffAttention(dim, 2 * module.num_heads, depth=_ye_depth(lam), lambda_init=lam,
                         lambda_form="dual_scalar" if module.dual_lambda else "reparam",
                         qkv_bias=module.qkv.bias is not None, out_bias=module.proj.bias is not None,
                         attn_drop=float(module.attn_drop_p), proj_drop=float(module.proj_drop.p),
                         backend=backend, sub_norm_eps=float(module.sub_norm.eps),
                         sub_norm_affine=getattr(module.sub_norm, "weight", None) is not None)
    ours.load_state_dict(timm_to_diffattn_state_dict(module.state_dict()), strict=True, assign=True)
    return ours.to(module.qkv.weight.device).train(module.training)


def to_timm_diff_attention(module: DiffAttention) -> nn.Module:
    """A :class:`~diffattn.DiffAttention` ``(dim, h)`` → ``timm.layers.DiffAttention(dim, num_heads=h/2)``.

    Needs what timm can express: no GQA, no rotary embedding, λ form reparam or ``dual_scalar``, one bias
    flag for q/k/v (missing ones filled with zeros). λ_init and the sub-norm eps are set on the timm module.
    A causal layer converts too; timm applies the causal mask only when called with ``is_causal=True``.
    """
    from timm.layers import DiffAttention as TimmDiffAttention

    check_convertible(module, "timm")
    if module.lambda_form not in ("reparam", "dual_scalar"):
        raise ValueError(f"timm DiffAttention has λ forms reparam and dual_scalar; module has "
                         f"lambda_form={module.lambda_form!r}")
    if module.num_kv_heads != module.num_heads:
        raise ValueError(f"timm DiffAttention has no grouped-query attention; module has "
                         f"num_kv_heads={module.num_kv_heads} != num_heads={module.num_heads}")
    if module.rotary is not None:
        raise ValueError(f"timm DiffAttention has no rotary embedding; module has "
                         f"rope={module.rotary.style!r}")
    qkv_bias = any(getattr(module, p).bias is not None for p in ("q_proj", "k_proj", "v_proj"))
    timm_mod = TimmDiffAttention(module.dim, num_heads=module.num_heads // 2, qkv_bias=qkv_bias,
                                 proj_bias=module.out_proj.bias is not None,
                                 attn_drop=float(module.attn_drop), proj_drop=float(module.proj_drop.p),
                                 depth=module.depth,
                                 dual_lambda=module.lambda_form == "dual_scalar")
    timm_mod.lambda_init = float(module.lambda_init)
    timm_mod.sub_norm.eps = float(module.diff_norm.eps)
    sd = dict(module.state_dict())
    if diff_norm_weight(module) is None:
        ref = module.q_proj.weight
        sd["diff_norm.weight"] = torch.ones(2 * module.head_dim, dtype=ref.dtype, device=ref.device)
    timm_mod.load_state_dict(diffattn_to_timm_state_dict(sd, qkv_bias=qkv_bias), strict=True, assign=True)
    return timm_mod.to(module.q_proj.weight.device).train(module.training)


# ----------------------------------------------------------------------------------------- ViT checkpoints


def convert_timm_vit_state_dict(state_dict: StateDict) -> dict[str, torch.Tensor]:
    """timm ``VisionTransformer`` keys → :class:`VisionTransformer` keys: ``attn.qkv`` (rows [q; k; v]) is
    split into ``q_proj``/``k_proj``/``v_proj`` and ``attn.proj`` becomes ``out_proj``; the rest keeps its
    name.
    Layer scale, q/k norms, register tokens and ``fc_norm`` are not supported (ValueError)."""
    out, bad = {}, []
    for key, v in state_dict.items():
        if m := re.match(r"blocks\.(\d+)\.attn\.(qkv|proj)\.(weight|bias)$", key):
            prefix = f"blocks.{m.group(1)}.attn."
            if m.group(2) == "qkv":
                for name, t in zip(("q_proj", "k_proj", "v_proj"), v.chunk(3, dim=0)):
                    out[f"{prefix}{name}.{m.group(3)}"] = t
            else:
                out[f"{prefix}out_proj.{m.group(3)}"] = v
        elif re.match(r"(cls_token|pos_embed|patch_embed\.proj\.|norm_pre\.|norm\.|head\.|"
                      r"blocks\.\d+\.(norm1|norm2|mlp\.fc1|mlp\.fc2)\.)", key):
            out[key] = v
        else:
            bad.append(key)
    if bad:
        raise ValueError(f"the timm ViT state dict has keys diffattn cannot map: {sorted(bad)[:10]}"
                         + (f" (+{len(bad) - 10} more)" if len(bad) > 10 else ""))
    return out


def load_timm_vit(src, name: str = "vit_base_patch16_224", **overrides) -> VisionTransformer:
    """timm ViT weights (a ``timm`` model, its state dict or a file) as diffattn's ``name`` (standard
    attention, LayerNorm eps 1e-6, GELU: timm's defaults). Sizes and classes are inferred; heads come from a
    model object or default to width / 64. The start of a retrofit: swap attention afterwards."""
    if isinstance(src, nn.Module):
        blk = getattr(src, "blocks", [None])[0]
        if blk is not None and hasattr(blk.attn, "num_heads"):
            overrides.setdefault("num_heads", blk.attn.num_heads)
    what = "the timm ViT"
    sd = convert_timm_vit_state_dict(source_state_dict(src, what))
    args = vision_args(sd, "", what)
    args["num_classes"] = take(sd, "head.weight", what, ndim=2).shape[0] if "head.weight" in sd else 0
    if args.pop("attention")["kind"] != "standard":
        raise ValueError("load_timm_vit takes standard-attention timm ViTs")
    args.update(overrides)
    return load_state_dict_exact(build(name, **args), sd, what)
