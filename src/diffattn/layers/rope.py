"""Rotary position embedding (Su et al. 2021, "RoFormer"), in both channel layouts in use.

- ``"half"`` (rotate-half; GPT-NeoX, Llama, DiffLlama): channel i pairs with channel i + d/2.
- ``"interleaved"`` (GPT-J, RoFormer): channel 2i pairs with channel 2i + 1.

For position p and pair frequency θ_i = base^(−2i/d):
    (x_a, x_b) ↦ (x_a cos pθ_i − x_b sin pθ_i, x_b cos pθ_i + x_a sin pθ_i).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..ops import upcast

__all__ = ["ROPE_STYLES", "RotaryEmbedding", "apply_rotary"]

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
        d = self.head_dim
        inv_freq = self.base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
        freqs = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # (..., N, d/2)
        if self.style == "half":
            freqs = torch.cat([freqs, freqs], dim=-1)  # (..., N, d)
        else:
            freqs = freqs.repeat_interleave(2, dim=-1)  # (..., N, d)
        return freqs.cos().to(dtype), freqs.sin().to(dtype)


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
