"""What a mask entry means, in one place for every backend: the operator (:mod:`diffattn.ops.functional`) and
the fused kernel (:mod:`diffattn.ops.kernels`) both read masks through :func:`blocked`. A leaf: it imports only
torch."""

from __future__ import annotations

import torch

__all__ = ["blocked"]


def blocked(mask: torch.Tensor) -> torch.Tensor:
    """True where a mask entry blocks attention: bool False, float −inf or ≤ finfo(mask.dtype).min / 2."""
    if mask.dtype == torch.bool:
        return ~mask
    return mask <= torch.finfo(mask.dtype).min / 2
