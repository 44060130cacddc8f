"""Split-heads, the "original" method of Li et al. 2025 (§3.2): each pretrained Q/K head's d channels split into two
groups of d/2, differential attention (Ye et al. 2024, eq. 1) on the groups, O = (1 − λ_init)·RMSNorm((A1 − λ A2) V).

The groups keep rotary pairs (channel i and i + d/2 under ``rotate_half`` RoPE) together: G1 = [0, d/4) ∪
[d/2, 3d/4), G2 = the rest, so each branch's scores stay functions of relative position. Scale: the model's scale
× √2 (the width halves); λ vectors have the branch width d/2 (Ye et al. 2024); V keeps width d. Blended in from the
pretrained output (:class:`~diffattn.adapters.methods.base.BlendedMethod`).
"""

from __future__ import annotations

import math

from .base import BlendedMethod, register_method
from .ops import attend, diff_attend, split_channels

__all__ = ["SplitHeads"]


@register_method("split_heads")
class SplitHeads(BlendedMethod):
    """(1 − λ_init)·RMSNorm((A(Q_G1, K_G1) − λ A(Q_G2, K_G2)) V), blended in by β(t)."""

    def check(self, *, dim, num_heads, head_dim, value_dim) -> None:
        if head_dim % 4 != 0:
            raise ValueError(f"method 'split_heads' needs a head width divisible by 4 (to split rotary pairs "
                             f"evenly), got head_dim={head_dim}")

    def lambda_width(self, head_dim: int) -> int:
        return head_dim // 2

    def differential(self, adapter, q, k, v, lam, weights, kw, full):
        g1, g2 = split_channels(q.shape[-1], q.device)
        od, ws = diff_attend(q[..., g1], k[..., g1], q[..., g2], k[..., g2], v, lam, weights,
                             **dict(kw, scale=kw["scale"] * math.sqrt(2.0)))
        first, second, pd = ws if ws is not None else (None, None, None)
        o1, p1 = (None, None) if full else attend(q, k, v, weights, **kw)
        return od, pd, first, second, o1, p1
