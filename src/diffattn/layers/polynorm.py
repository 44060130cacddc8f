"""PolyNorm (Zhuo et al. 2024, "Polynomial Composition Activations", arXiv 2411.03884) and the gated MLP of the
Motif models (Motif Technologies 2025, arXiv 2508.09148), which puts it where SwiGLU puts SiLU.

    PolyNorm(x) = w0 · n(x³) + w1 · n(x²) + w2 · n(x) + b,   n(t) = t / √(mean(t²) + eps)   (over the last dim)
    MLP(x) = down_proj(PolyNorm(gate_proj(x)) ⊙ up_proj(x))

w ∈ R³ starts at 1/3 each and b ∈ R at 0; the statistics run in at least float32 (float64 stays float64) and the
result is cast back, as the released code does. The parameters are ``act_fn.weight`` and ``act_fn.bias``, the names of
the released checkpoints.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..ops import upcast

__all__ = ["PolyNorm", "PolyNormGLU"]


class PolyNorm(nn.Module):
    """w0 · n(x³) + w1 · n(x²) + w2 · n(x) + b (module docstring); x (..., D) → (..., D) in x's dtype."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < float("inf"):
            raise ValueError(f"eps must be a finite float > 0, got {eps!r}")
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3))
        self.bias = nn.Parameter(torch.zeros(1))

    def _norm(self, t: torch.Tensor) -> torch.Tensor:
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = upcast(x)
        w, b = self.weight.to(xf.dtype), self.bias.to(xf.dtype)
        out = w[0] * self._norm(xf ** 3) + w[1] * self._norm(xf * xf) + w[2] * self._norm(xf) + b
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


class PolyNormGLU(nn.Module):
    """down_proj(PolyNorm(gate_proj(x)) ⊙ up_proj(x)): the MLP of Motif-2.6B and Motif-2-12.7B; x (B, N, D) →
    (B, N, D). ``hidden_dim`` is the width of each of the gate and up projections (``intermediate_size``)."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = False, eps: float = 1e-6, drop: float = 0.0):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=bias)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=bias)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=bias)
        self.act_fn = PolyNorm(eps)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))
