"""DiffV (DAA (2025) App. D.2): V2 = (X W_dv) W_v, output A (V1 − λ(t) V2) = A V1 − λ(t) A V2; W_dv (D, D), D² new
parameters per layer; one map."""

from __future__ import annotations

from .base import Branches, InputMethod, register_method
from .ops import attend


@register_method("diffv")
class DiffV(InputMethod):
    """Second value from the transformed input X W_dv; A (V1 − λ(t) V2)."""

    which = "v"

    def attend(self, adapter, q, k, v, *, q2, k2, v2, lam, weights, kw) -> Branches:
        out, p = attend(q, k, v - lam.to(v.dtype) * v2, weights, **kw)
        return Branches(out, p, None, p)
