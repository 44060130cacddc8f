"""Helpers shared by the converters: strict key access with clear errors, head-count checks, size bounds."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch
import torch.nn as nn

from ..layers import DiffAttention, GatedDiffAttention
from ..models.config import SIZE_BOUNDS

__all__ = ["StateDict", "LAMBDAS", "take", "check_no_extra", "check_even_heads", "check_convertible",
           "diff_norm_weight", "block_count", "heads_of", "vision_args"]

StateDict = Mapping[str, torch.Tensor]
LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")  # the reparameterised λ vectors (Ye et al. 2024 eq. 2)


def take(sd: StateDict, key: str, where: str, *, ndim: int | None = None) -> torch.Tensor:
    """``sd[key]``, or a ValueError naming the missing key; empty tensors and wrong ranks are refused too."""
    if key not in sd:
        keys = sorted(sd)
        shown = f"{keys[:12]}" + (f" (+{len(keys) - 12} more)" if len(keys) > 12 else "")
        raise ValueError(f"{where} state dict has no {key!r}; it has {len(keys)} keys: {shown}")
    t = sd[key]
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{where} state dict entry {key!r} must be a tensor, got {type(t).__name__}")
    if t.numel() == 0:
        raise ValueError(f"{where} state dict entry {key!r} is empty (shape {tuple(t.shape)})")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{where} state dict entry {key!r} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    return t


def check_no_extra(sd: StateDict, known: set[str], where: str) -> None:
    extra = sorted(set(sd) - known)
    if extra:
        raise ValueError(f"{where} state dict has keys this converter cannot express exactly: {extra}")


def check_even_heads(name: str, n) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 2 or n % 2:
        raise ValueError(f"{name} must be an even integer >= 2 (heads pair into differential heads), got {n!r}")


def block_count(sd: StateDict, prefix: str, where: str) -> int:
    """Number of blocks ``prefix<i>.*`` (max index + 1), bounded by ``SIZE_BOUNDS["depth"]`` before anything is
    built: a file with one key ``blocks.100000.x`` must not make a loader build 100,001 blocks."""
    idx = {int(m.group(1)) for k in sd if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    if not idx:
        raise ValueError(f"{where} state dict has no blocks under {prefix!r}")
    depth = max(idx) + 1
    lo, hi = SIZE_BOUNDS["depth"]
    if depth > hi:
        raise ValueError(f"{where} state dict has a key under {prefix}{depth - 1}.*, which means depth = {depth}; "
                         f"depth must be an integer in [{lo}, {hi}]")
    missing = sorted(set(range(depth)) - idx)
    if missing:
        raise ValueError(f"{where} state dict has blocks up to {prefix}{depth - 1} but none for indices "
                         f"{missing[:10]}")
    return depth


def check_convertible(module: nn.Module, target: str) -> None:
    if not isinstance(module, DiffAttention) or isinstance(module, GatedDiffAttention):
        raise ValueError(f"module must be a diffattn.DiffAttention (not gated) to convert to {target}, got "
                         f"{type(module).__name__}")
    if isinstance(module.diff_norm, nn.Identity):
        raise ValueError(f"module has no sub-norm (sub_norm=False); {target} always applies one")
    if module.out_scale != 1.0 - module.lambda_init:
        raise ValueError(f"module scales its output by {module.out_scale} (output_scale="
                         f"{module.config.output_scale!r}); {target} always scales the sub-norm's output by "
                         f"1 − λ_init = {1.0 - module.lambda_init}")
    if module.diff_norm.eps is None:
        raise ValueError("module.diff_norm.eps is None (dtype dependent); set a float eps before converting")


def diff_norm_weight(module: DiffAttention) -> torch.Tensor | None:
    return module.diff_norm.weight if module.diff_norm.elementwise_affine else None


# ------------------------------------------------------------------------------------ shape inference


def heads_of(sd: StateDict, prefix: str, width: int, where: str) -> tuple[str, int]:
    """(attention, num_heads) of the blocks under ``prefix`` (converted keys): a differential tower reveals its head
    width d through ``lambda_q1`` (h = width / d); otherwise width / 64 (OpenAI CLIP, open_clip, timm ViTs)."""
    key = f"{prefix}0.attn.lambda_q1"
    if key in sd:
        d = take(sd, key, where).numel()
        if width % d:
            raise ValueError(f"{where} state dict: {key} has {d} values, which does not divide the width {width}")
        return "diff", width // d
    return "standard", max(width // 64, 1)


def vision_args(sd: StateDict, prefix: str, where: str) -> dict:
    """VisionTransformer arguments read from the shapes of a converted state dict (keys under ``prefix``)."""
    w = take(sd, f"{prefix}patch_embed.proj.weight", where, ndim=4)  # (D, C, p, p)
    d, p = w.shape[0], w.shape[-1]
    pos = take(sd, f"{prefix}pos_embed", where, ndim=3)  # (1, P + N, D)
    n = pos.shape[1] - (1 if f"{prefix}cls_token" in sd else 0)
    side = math.isqrt(max(n, 0))
    if n < 1 or side * side != n:
        raise ValueError(f"{where} state dict: pos_embed must hold a square grid of patches (+ CLS), got {n} patch "
                         f"positions")
    depth = block_count(sd, f"{prefix}blocks.", where)
    attention, heads = heads_of(sd, f"{prefix}blocks.", d, where)
    fc1 = take(sd, f"{prefix}blocks.0.mlp.fc1.weight", where, ndim=2)
    return dict(img_size=side * p, patch_size=p, in_chans=w.shape[1], embed_dim=d, depth=depth, num_heads=heads,
                attention={"kind": attention}, mlp_ratio=fc1.shape[0] / d,
                patch_bias=f"{prefix}patch_embed.proj.bias" in sd,
                pre_norm=f"{prefix}norm_pre.weight" in sd)
