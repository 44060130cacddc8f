"""Shared-QK, the "proposed" method of Li et al. 2025 (§3.3): A2 = A1, O = (1 − λ_init)·RMSNorm((A1 − λ A1) V).

Degenerate, faithfully so: (A1 − λ A1) V = (1 − λ) A1 V, and the RMSNorm removes every dependence on λ except its
sign (Li et al.'s public code has the same property). λ vectors of width d; blended in from the pretrained output
(:class:`~diffattn.adapters.methods.base.BlendedMethod`).
"""

from __future__ import annotations

from .base import BlendedMethod, register_method
from .ops import attend


@register_method("shared_qk")
class SharedQK(BlendedMethod):
    """(1 − λ_init)·RMSNorm((1 − λ) A1 V), blended in by β(t)."""

    def lambda_width(self, head_dim: int) -> int:
        return head_dim

    def differential(self, adapter, q, k, v, lam, weights, kw, full):
        o1, p1 = attend(q, k, v, weights, **kw)
        od = (1.0 - lam).to(o1.dtype) * o1
        pd = None if p1 is None else (1.0 - lam).to(p1.dtype) * p1
        return od, pd, p1, p1, o1, p1
