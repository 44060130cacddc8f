"""Transformer building blocks shared by the model families: patch embedding, stochastic depth, the pre-norm block.

    block:  x = x + drop_path(attn(norm1(x)));   x = x + drop_path(mlp(norm2(x)))        (pre-norm)

Parameter names follow timm (``patch_embed.proj``, ``blocks.i.norm1``/``mlp.fc1``/``norm2``), so vision checkpoints
map onto them key by key.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .attention import attention_class
from .mlp import build_mlp

__all__ = ["Block", "PatchEmbed", "DropPath"]


class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016): drop the residual branch per sample with probability p."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - self.p)  # (B, 1, ..., 1)
        return x * keep / (1.0 - self.p)


class PatchEmbed(nn.Module):
    """Non-overlapping patches, Conv2d(kernel = stride = p): (B, C, H, W) → (B, N, D), N = (H/p)·(W/p)."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int, *, bias: bool = True):
        super().__init__()
        self.img_size, self.patch_size = img_size, patch_size
        self.grid_size = img_size // patch_size
        self.num_patches = self.grid_size**2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.proj.in_channels or tuple(x.shape[-2:]) != (self.img_size,) * 2:
            raise ValueError(f"images must have shape (B, {self.proj.in_channels}, {self.img_size}, "
                             f"{self.img_size}), got {tuple(x.shape)}")
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)


class Block(nn.Module):
    """Pre-norm transformer block with a switchable attention layer (:func:`attention_class`).

        x = x + drop_path(attn(norm1(x)));   x = x + drop_path(mlp(norm2(x)))

    ``depth`` is the 0-based index of the block (for ``lambda_init="ye"``); ``lambda_form`` names a λ form of
    :mod:`diffattn.lambdas` (None: the layer's default); ``sub_norm`` turns the differential layer's per-head
    sub-norm on or off (None: the λ form's default); ``causal`` makes it a text block;
    ``q_residual`` is the [Q⁺; Q⁻] residual of M-DGSA (2025, §4.3) and needs ``attention="gated"``.
    """

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0, attention: str = "standard",
                 lambda_init: float | str = 0.8, lambda_form: str | None = None, sub_norm: bool | None = None,
                 mlp: str = "gelu",
                 mlp_ratio: float = 4.0, mlp_dropouts: int = 2, qkv_bias: bool = True, q_residual: bool = False,
                 causal: bool = False, norm_eps: float = 1e-6, drop: float = 0.0, attn_drop: float = 0.0,
                 drop_path: float = 0.0, backend: str = "auto"):
        super().__init__()
        attn_kwargs = dict(depth=depth, lambda_init=lambda_init, qkv_bias=qkv_bias, causal=causal,
                           attn_drop=attn_drop, proj_drop=drop, backend=backend)
        if lambda_form is not None:  # None: the layer's own λ form (reparam for "diff", the gate for "gated")
            attn_kwargs["lambda_form"] = lambda_form
        if sub_norm is not None:  # None: the layer's own default (the λ form's for "diff" and "gated")
            attn_kwargs["sub_norm"] = sub_norm
        if attention == "gated":
            attn_kwargs["q_residual"] = q_residual
        elif q_residual:
            raise ValueError(f"q_residual is the [Q⁺; Q⁻] residual of M-DGSA and needs attention='gated', "
                             f"got attention={attention!r}")
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = attention_class(attention)(dim, num_heads, **attn_kwargs)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = build_mlp(dim, mlp, mlp_ratio, drop=drop, mlp_dropouts=mlp_dropouts)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, need_weights: bool = False):
        """x: (B, N, D) → (B, N, D); with ``need_weights`` also the layer's AttentionWeights."""
        res = self.attn(self.norm1(x), attn_mask, need_weights)
        a, weights = res if need_weights else (res, None)
        x = x + self.drop_path1(a)  # (B, N, D)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return (x, weights) if need_weights else x
