"""Feed-forward blocks: the GELU MLP of ViT/CLIP, QuickGELU, and the SwiGLU of DGViT/DGT.

``build_mlp(dim, mlp, mlp_ratio)`` is the one place a model picks its feed-forward block by name (``MLP_TYPES``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Mlp", "SwiGLU", "QuickGELU", "MLP_TYPES", "build_mlp"]

MLP_TYPES = ("gelu", "quick_gelu", "swiglu")


class QuickGELU(nn.Module):
    """x · σ(1.702 x), the activation of OpenAI CLIP (Radford et al. 2021) and of the DiffCLIP text tower."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class Mlp(nn.Module):
    """fc1 → GELU → dropout → fc2 → dropout (Dosovitskiy et al. 2021)."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))  # (B, N, D)


class SwiGLU(nn.Module):
    """SwiGLU(x) = W_down (SiLU(x W_gate) ⊙ x W_up) (Shazeer 2020), the FFN of DGViT/DGT (M-DGSA 2025, §4.3).

    ``hidden_dim`` is the width of each of the gate and up projections. ``inner_drop`` sits between the activation
    and the down projection and ``drop`` after it: M-DGSA (2025, App. B) studies one or two dropout layers.
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
        return self.drop(self.down_proj(self.inner_drop(h)))  # (B, N, D)


def build_mlp(dim: int, mlp: str, mlp_ratio: float, *, drop: float = 0.0, mlp_dropouts: int = 2) -> nn.Module:
    """The feed-forward block by name.

    ``"gelu"`` / ``"quick_gelu"``: fc1 → act → fc2 with hidden width ⌊r·D⌋. ``"swiglu"`` (M-DGSA 2025, §4.3): the
    expansion r is the width of the fused first projection, split into gate and up halves of ⌊r·D/2⌋ each (the
    paper's ×2/×4/×16/3 parameter counts). ``mlp_dropouts=1`` keeps only the dropout between the activation and the
    down projection (a SwiGLU layout); ``2`` adds one after the down projection.
    """
    if mlp not in MLP_TYPES:
        raise ValueError(f"mlp must be one of {MLP_TYPES}, got {mlp!r}")
    if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or not 0 < mlp_ratio <= 64:
        raise ValueError(f"mlp_ratio must be a number in (0, 64], got {mlp_ratio!r}")
    if mlp_dropouts not in (1, 2):
        raise ValueError(f"mlp_dropouts must be 1 or 2 (one or two dropout layers), got {mlp_dropouts!r}")
    if mlp == "swiglu":
        return SwiGLU(dim, int(dim * mlp_ratio / 2), drop=drop if mlp_dropouts == 2 else 0.0, inner_drop=drop)
    if mlp_dropouts != 2 and drop > 0:
        raise ValueError(f"mlp_dropouts=1 is a SwiGLU layout; mlp={mlp!r} has two dropouts")
    m = Mlp(dim, int(dim * mlp_ratio), drop=drop)
    if mlp == "quick_gelu":
        m.act = QuickGELU()
    return m
