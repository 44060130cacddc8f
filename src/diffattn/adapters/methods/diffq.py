"""DiffQ (DAA (2025) App. D.2): Q2 = (X W_dq) W_q, output (A(Q1, K) − λ(t) A(Q2, K)) V; W_dq (D, D), D² new
parameters per layer."""

from __future__ import annotations

from .base import InputMethod, register_method


@register_method("diffq")
class DiffQ(InputMethod):
    """Second query from the transformed input X W_dq; (A(Q1, K) − λ(t) A(Q2, K)) V."""

    which = "q"
