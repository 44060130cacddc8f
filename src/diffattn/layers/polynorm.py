"""PolyNorm (Zhuo et al. 2024, "Polynomial Composition Activations", arXiv 2411.03884) and the gated MLPs of the
Motif models (Motif Technologies 2025, arXiv 2508.09148; Motif-3, Motif Technologies 2026), which put it where
SwiGLU puts SiLU.

    PolyNorm(x) = w0 · n(x³) + w1 · n(x²) + w2 · n(x) + b,   n(t) = t / √(mean(t²) + eps)   (over the last dim)
    MLP(x) = down_proj(PolyNorm(gate_proj(x)) ⊙ up_proj(x))                                  (Motif-2)

w ∈ R³ starts at 1/3 each and b ∈ R at 0; the statistics run in at least float32 (float64 stays float64) and the
result is cast back, as the released code does. The parameters are ``act_fn.weight`` and ``act_fn.bias``, the names of
the released checkpoints.

Motif-3's dense MLP (:class:`Motif3PolyNormGLU`) reads the coefficients through a sigmoid and clamps, as llama.cpp's
Motif-3 graph computes it (``build_polynorm_mlp`` / ``build_polynorm_act`` in ``src/models/motif3.cpp`` of the
Motif-3 fork of llama.cpp, MIT; ``conversion/motif3.py`` there for the ``config.json`` keys):

    g = c(gate_proj(x)),  u = c(up_proj(x)),  c(t) = clamp(t, −hidden_clamp, hidden_clamp)   (no clamp when unset)
    w = sigmoid(act_fn.weight) (or act_fn.weight when polynorm_sigmoid_weight is false),  b = act_fn.bias
    MLP(x) = down_proj(output_scale · (w0 · n(g³) + w1 · n(g²) + w2 · n(g) + b) ⊙ u)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..ops import upcast

__all__ = ["PolyNorm", "PolyNormGLU", "Motif3PolyNormGLU"]


class PolyNorm(nn.Module):
    """w0 · n(x³) + w1 · n(x²) + w2 · n(x) + b (module docstring); x (..., D) → (..., D) in x's dtype. With
    ``sigmoid_weight`` the coefficients are sigmoid(weight) (Motif-3), else the weight itself (Motif-2)."""

    def __init__(self, eps: float = 1e-6, *, sigmoid_weight: bool = False):
        super().__init__()
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < float("inf"):
            raise ValueError(f"eps must be a finite float > 0, got {eps!r}")
        if not isinstance(sigmoid_weight, bool):
            raise ValueError(f"sigmoid_weight must be a bool, got {sigmoid_weight!r}")
        self.eps = float(eps)
        self.sigmoid_weight = sigmoid_weight
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3))
        self.bias = nn.Parameter(torch.zeros(1))

    def _norm(self, t: torch.Tensor) -> torch.Tensor:
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.eps)

    def poly(self, xf: torch.Tensor) -> torch.Tensor:
        """PolyNorm of ``xf`` computed in ``xf``'s dtype (no cast back)."""
        w, b = self.weight.to(xf.dtype), self.bias.to(xf.dtype)
        if self.sigmoid_weight:
            w = torch.sigmoid(w)
        return w[0] * self._norm(xf ** 3) + w[1] * self._norm(xf * xf) + w[2] * self._norm(xf) + b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.poly(upcast(x)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}" + (", sigmoid_weight=True" if self.sigmoid_weight else "")


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


def _positive(name: str, value, *, none: bool = False) -> float | None:
    if value is None and none:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite float > 0{' or None' if none else ''}, got {value!r}")
    return float(value)


class Motif3PolyNormGLU(nn.Module):
    """The dense MLP of Motif-3 (module docstring): down_proj(output_scale · PolyNorm_σ(c(gate)) ⊙ c(up)); x (..., D)
    → (..., D), no biases. The parameters carry the released names under ``model.layers.{l}.mlp.``:
    ``gate_proj.weight``, ``up_proj.weight``, ``down_proj.weight``, ``act_fn.weight`` (3), ``act_fn.bias`` (1).

    Arguments and the ``config.json`` key each comes from, with the public code's default:

    - ``dim``: ``hidden_size``; ``hidden_dim``: ``intermediate_size`` (the width of the gate and up projections);
    - ``eps``: PolyNorm's eps, 1e-6 (not in ``config.json``; llama.cpp's converter writes 1e-6 as
      ``polynorm.epsilon``);
    - ``sigmoid_weight``: ``polynorm_sigmoid_weight``, true: the coefficients are sigmoid(``act_fn.weight``);
    - ``output_scale``: ``polynorm_output_scale``, 1.0: multiplies the gated activation before ``down_proj``;
    - ``hidden_clamp``: ``hidden_clamp``, unset (None): clamps the gate and up projections to [−c, c] before the
      activation (llama.cpp applies it only when c > 0).

    ``polynorm_bias_clamp`` (unset by default) does not reach a dense MLP. The routed experts of the MoE layers, which
    diffattn does not build, compute the same activation with per-expert coefficients (``moe.experts.act_fn.weight``
    (E, 3), ``.bias`` (E, 1)) and two more clamps: their bias is clamped to [−bias_clamp, bias_clamp] when
    ``polynorm_bias_clamp`` > 0, and the product PolyNorm(g) ⊙ u to [−hidden_clamp, hidden_clamp] when
    ``hidden_clamp`` > 0 (``build_moe_polynorm``: ``clamp_bias``, ``clamp_result``). The shared expert computes
    the dense MLP's form, without these two clamps.

    The activation and its product with the up projection run in at least float32 and are cast back once to the
    projections' dtype; the output scale multiplies after that cast, as the released serving code does (llama.cpp
    computes all in float32; in float64 the two orders agree).
    """

    def __init__(self, dim: int, hidden_dim: int, *, eps: float = 1e-6, sigmoid_weight: bool = True,
                 output_scale: float = 1.0, hidden_clamp: float | None = None):
        super().__init__()
        for name, value in (("dim", dim), ("hidden_dim", hidden_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.output_scale = _positive("output_scale", output_scale)
        self.hidden_clamp = _positive("hidden_clamp", hidden_clamp, none=True)
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)
        self.act_fn = PolyNorm(eps, sigmoid_weight=sigmoid_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.hidden_clamp is not None:
            gate = gate.clamp(-self.hidden_clamp, self.hidden_clamp)
            up = up.clamp(-self.hidden_clamp, self.hidden_clamp)
        h = (self.act_fn.poly(upcast(gate)) * upcast(up)).to(gate.dtype)
        if self.output_scale != 1.0:
            h = h * self.output_scale
        return self.down_proj(h)

    def extra_repr(self) -> str:
        return f"output_scale={self.output_scale}, hidden_clamp={self.hidden_clamp}"
