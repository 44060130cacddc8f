"""DiffK (DAA (2025) App. D.2): K2 = (X W_dk) W_k, output (A(Q, K1) − λ(t) A(Q, K2)) V; W_dk (D, D), D² new
parameters per layer."""

from __future__ import annotations

from .base import InputMethod, register_method


@register_method("diffk")
class DiffK(InputMethod):
    """Second key from the transformed input X W_dk; (A(Q, K1) − λ(t) A(Q, K2)) V."""

    which = "k"
