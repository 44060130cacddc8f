"""Normalisation layers."""

from __future__ import annotations

import torch.nn as nn

__all__ = ["RMSNorm", "head_rms_norm"]

RMSNorm = nn.RMSNorm  # RMSNorm(x) = x / sqrt(mean(x²) + eps) ⊙ w (Zhang & Sennrich 2019)


def head_rms_norm(width: int, *, eps: float = 1e-5, affine: bool = True) -> nn.RMSNorm:
    """Per-head RMSNorm of width 2d, the "GroupNorm" of Ye et al. 2024 §2.1 (``diff_norm``, eps 1e-5)."""
    return nn.RMSNorm(width, eps=eps, elementwise_affine=affine)
