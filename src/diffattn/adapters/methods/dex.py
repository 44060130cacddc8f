"""DEX (DAA (2025) eq. 11, after Kong et al. 2025): no second map; the output is (A1 V)(I − λ(t) W_dex).

W_dex (h, dv, dv) per head is the identity at init. New parameters: D²/h per layer (DAA (2025) App. B).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .base import AnnealedMethod, Branches, register_method
from .ops import attend


@register_method("dex")
class DEX(AnnealedMethod):
    """(A1 V)(I − λ(t) W_dex) (DAA (2025) eq. 11), λ(t) annealed from 0 (eq. 3); one map, A1."""

    def init_parameters(self, adapter, *, device=None, dtype=None) -> None:
        eye = torch.eye(adapter.value_dim, device=device, dtype=dtype)
        adapter.W_dex = nn.Parameter(eye.repeat(adapter.num_heads, 1, 1))  # (h, dv, dv)

    def attend(self, adapter, q, k, v, *, q2, k2, v2, lam, weights, kw) -> Branches:
        o1, p = attend(q, k, v, weights, **kw)  # (B, h, Nq, dv)
        o_w = torch.einsum("bhnd,hde->bhne", o1, adapter.W_dex.to(o1.dtype))  # (B, h, Nq, dv)
        return Branches(o1 - lam.to(o1.dtype) * o_w, p, None, p)
