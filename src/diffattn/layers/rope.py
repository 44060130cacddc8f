"""Rotary position embedding (Su et al. 2021, "RoFormer"), in both channel layouts in use.

- ``"half"`` (rotate-half; GPT-NeoX, Llama, DiffLlama): channel i pairs with channel i + d/2.
- ``"interleaved"`` (GPT-J, RoFormer): channel 2i pairs with channel 2i + 1.

For position p and pair frequency θ_i = base^(−2i/d):
    (x_a, x_b) ↦ (x_a cos pθ_i − x_b sin pθ_i, x_b cos pθ_i + x_a sin pθ_i).

:class:`YarnRotaryEmbedding` replaces θ_i by YaRN's frequencies (Peng et al. 2023, "YaRN", arXiv 2309.00071, §3.2
"NTK-by-parts"), as ggml computes them (``ggml_rope_yarn_corr_dims`` and ``rope_yarn``, MIT) and as Hugging Face's
``_compute_yarn_parameters`` does (the same ramp, truncated): for a context extended by ``factor`` s from an original
L positions,

    c(β) = d · ln(L / (2π β)) / (2 ln base)              (the pair index whose wavelength fits β times into L)
    lo = max(0, ⌊c(β_fast)⌋),   hi = min(d − 1, ⌈c(β_slow)⌉)
    γ_i = 1 − clamp((i − lo) / max(0.001, hi − lo), 0, 1)
    θ_i' = (θ_i / s)(1 − γ_i) + θ_i γ_i                  (fast pairs extrapolated, slow pairs interpolated)

The tables stay of magnitude 1: the attention temperature YaRN adds, (1 + 0.1 · mscale · ln s)², belongs to the
softmax scale, which the layer owns (DeepSeek-V2; llama.cpp's Motif-3 graph).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..checks import check_positive_float, check_positive_int
from ..ops import upcast

__all__ = ["ROPE_STYLES", "RotaryEmbedding", "YarnRotaryEmbedding", "apply_rotary", "yarn_softmax_factor"]

ROPE_STYLES = ("half", "interleaved")


class RotaryEmbedding(nn.Module):
    """cos/sin tables for head width ``head_dim``; ``forward(positions)`` returns two (…, N, head_dim) tensors."""

    def __init__(self, head_dim: int, *, base: float = 10000.0, style: str = "half"):
        super().__init__()
        if style not in ROPE_STYLES:
            raise ValueError(f"rope style must be one of {ROPE_STYLES}, got {style!r}")
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head width, got head_dim={head_dim}")
        self.head_dim, self.base, self.style = head_dim, float(base), style

    def forward(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for integer ``positions`` (N,) or (B, N), computed in float64 (no buffer: ``model.half()``
        must not round the frequencies) and returned in ``dtype``."""
        freqs = positions.to(torch.float64).unsqueeze(-1) * self.inv_freq(positions.device)  # (..., N, d/2)
        if self.style == "half":
            freqs = torch.cat([freqs, freqs], dim=-1)  # (..., N, d)
        else:
            freqs = freqs.repeat_interleave(2, dim=-1)  # (..., N, d)
        return freqs.cos().to(dtype), freqs.sin().to(dtype)

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """The pair frequencies θ_i = base^(−2i/d), float64 (d/2,)."""
        d = self.head_dim
        return self.base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)


class YarnRotaryEmbedding(RotaryEmbedding):
    """:class:`RotaryEmbedding` with YaRN's frequencies (module docstring) for a context ``factor`` times the
    ``original_context`` positions the model was trained on; ``beta_fast`` and ``beta_slow`` bound the ramp
    between extrapolated and interpolated pairs (32 and 1: YaRN's, llama.cpp's and Hugging Face's defaults)."""

    def __init__(self, head_dim: int, *, base: float = 10000.0, style: str = "half", factor: float,
                 original_context: int, beta_fast: float = 32.0, beta_slow: float = 1.0):
        super().__init__(head_dim, base=base, style=style)
        check_positive_float("YaRN factor", factor)
        if factor < 1.0:
            raise ValueError(f"YaRN factor must be >= 1 (the context extension), got {factor!r}")
        check_positive_int("YaRN original_context", original_context, optional=False)
        check_positive_float("YaRN beta_fast", beta_fast)
        check_positive_float("YaRN beta_slow", beta_slow)
        self.factor, self.original_context = float(factor), original_context
        self.beta_fast, self.beta_slow = float(beta_fast), float(beta_slow)

    def correction_range(self) -> tuple[float, float]:
        """(lo, hi): the pair indices where the ramp from extrapolation to interpolation starts and ends."""
        d, base, n = self.head_dim, self.base, self.original_context

        def dim(beta: float) -> float:
            return d * math.log(n / (beta * 2 * math.pi)) / (2 * math.log(base))

        return max(0.0, math.floor(dim(self.beta_fast))), min(d - 1.0, math.ceil(dim(self.beta_slow)))

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """YaRN's pair frequencies θ_i' (module docstring), float64 (d/2,)."""
        extrap = super().inv_freq(device)
        lo, hi = self.correction_range()
        i = torch.arange(self.head_dim // 2, dtype=torch.float64, device=device)
        ramp = 1.0 - ((i - lo) / max(0.001, hi - lo)).clamp(0.0, 1.0)
        return extrap / self.factor * (1.0 - ramp) + extrap * ramp


def yarn_softmax_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature on the softmax scale, (1 + 0.1 · mscale · ln factor)² (1 for factor <= 1), as
    DeepSeek-V2 (``softmax_scale · mscale²``) and llama.cpp's Motif-3 graph (``kq_scale_full``) apply it."""
    m = 1.0 + 0.1 * mscale * math.log(factor) if factor > 1.0 else 1.0
    return m * m


def _rotate(x: torch.Tensor, style: str) -> torch.Tensor:
    if style == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([-x2, x1], dim=-1).flatten(-2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str = "half") -> torch.Tensor:
    """Rotate ``x`` (B, heads, N, d) by tables (N, d) or (B, N, d); computed in ≥ float32, returned in x's dtype."""
    if cos.dim() == 3:  # (B, N, d) -> (B, 1, N, d)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    xf = upcast(x)
    return (xf * cos + _rotate(xf, style) * sin).to(x.dtype)
