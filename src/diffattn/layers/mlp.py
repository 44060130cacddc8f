"""Feed-forward blocks: the GELU MLP of ViT/CLIP and the SwiGLU of DGViT/DGT (Shazeer 2020; seed 004 §4.3)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Mlp", "SwiGLU"]


class Mlp(nn.Module):
    """fc1 → GELU → dropout → fc2 → dropout (Dosovitskiy et al. 2021)."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class SwiGLU(nn.Module):
    """SwiGLU(x) = W_down (SiLU(x W_gate) ⊙ x W_up) (Shazeer 2020), the FFN of DGViT/DGT (seed 004 §4.3).

    ``hidden_dim`` is the expanded width (seed 004 uses ×2, ×4 and ×16/3 of ``dim``). ``inner_drop`` sits between
    the activation and the down projection and ``drop`` after it: seed 004 App. B studies one or two dropout layers.
    """

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True, drop: float = 0.0, inner_drop: float = 0.0):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=bias)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=bias)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=bias)
        self.inner_drop = nn.Dropout(inner_drop)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (B, N, hidden)
        return self.drop(self.down_proj(self.inner_drop(h)))
