"""Transformer building blocks shared by the model families: patch embedding, stochastic depth, the pre-norm block.

    block:  x = x + drop_path(attn(norm1(x)));   x = x + drop_path(mlp(norm2(x)))        (pre-norm)

Parameter names follow timm (``patch_embed.proj``, ``blocks.i.norm1``/``mlp.fc1``/``norm2``), so vision checkpoints
map onto them key by key.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn as nn

from .mlp import build_mlp
from .spec import STANDARD, AttentionSpec, LooseAttention

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
    """Pre-norm transformer block with a switchable attention layer (:class:`~diffattn.layers.AttentionSpec`).

        x = x + drop_path(attn(norm1(x)));   x = x + drop_path(mlp(norm2(x)))

    ``attention`` is an :class:`~diffattn.layers.AttentionSpec` or its dict; the layer is ``attention.build(dim,
    num_heads, depth)``. ``depth`` is the 0-based index of the block (for ``lambda_init="ye"``); ``drop`` is the
    MLP's dropout. The loose keywords of before (:data:`LOOSE`) are deprecated
    (:class:`~diffattn.layers.LooseAttention`).
    """

    #: the spelling of before: ``attention="gated", lambda_init=…, q_residual=…``; ``drop`` was ``proj_drop`` too
    LOOSE = LooseAttention("Block", ("lambda_init", "lambda_form", "sub_norm", "qkv_bias", "q_residual", "causal",
                                     "attn_drop", "backend"), fill={"proj_drop": "drop"})

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0,
                 attention: AttentionSpec | Mapping = STANDARD, mlp: str = "gelu",
                 mlp_ratio: float = 4.0, mlp_dropouts: int = 2, norm_eps: float = 1e-6, drop: float = 0.0,
                 drop_path: float = 0.0, **loose):
        super().__init__()
        spec = self.LOOSE.resolve(attention, loose, {"drop": drop})
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = spec.build(dim, num_heads, depth)
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
