"""DAA (2025, eq. 4; App. D): the second query is rotated per head, A2 = A(Q W_daa, K), output (A1 − λ(t) A2) V.

W_daa (h, d, d) is the identity at init and applies before the rotary embedding (when the model has one), so A2
stays a function of relative positions; at init both orders agree. New parameters: D²/h per layer (App. B).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .base import AnnealedMethod, register_method


@register_method("daa")
class DAA(AnnealedMethod):
    """A2 = A(Q W_daa, K); (A1 − λ(t) A2) V (DAA (2025) eq. 4), λ(t) annealed from 0 (eq. 3)."""

    def init_parameters(self, adapter, *, device=None, dtype=None) -> None:
        eye = torch.eye(adapter.head_dim, device=device, dtype=dtype)
        adapter.W_daa = nn.Parameter(eye.repeat(adapter.num_heads, 1, 1))  # (h, d, d)

    def transform_query(self, adapter, q: torch.Tensor) -> torch.Tensor:
        """Q W_daa per head. q: (B, h, N, d) → (B, h, N, d)."""
        return torch.einsum("bhnd,hde->bhne", q, adapter.W_daa.to(q.dtype))

    def second_branch(self, adapter, x, q, project):
        return self.transform_query(adapter, q), None, None
