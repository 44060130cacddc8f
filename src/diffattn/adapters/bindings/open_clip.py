"""Binding for open_clip: its ``ResidualAttentionBlock`` s use ``nn.MultiheadAttention``, which cannot be
subclassed usefully (its fast path bypasses ``forward`` overrides of the math), so ``block.attn`` is replaced by
:class:`DiffMultiheadAttention`, which keeps the very same ``in_proj_weight``, ``in_proj_bias`` and ``out_proj``
(same state-dict names: open_clip checkpoints load unchanged) and runs the retrofit.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...ops import restrict_mask
from ..binding import ADAPTER_ATTR, BindingBase, Candidate
from ..methods import RetrofitAdapter, run_method, second_branch

__all__ = ["DiffMultiheadAttention", "OpenClipBinding"]


class DiffMultiheadAttention(nn.Module):
    """Self-attention with the interface and weights of an ``nn.MultiheadAttention``, retrofitted.

    ``attn_mask``: (N, N) or (B·h, N, N), bool (True = **blocked**, the ``nn.MultiheadAttention`` convention) or
    additive float; ``key_padding_mask``: (B, N), True = padding. Cross-attention (key is not query) is not
    supported.
    """

    def __init__(self, mha: nn.MultiheadAttention, adapter: RetrofitAdapter):
        super().__init__()
        if not mha._qkv_same_embed_dim or mha.in_proj_weight is None:
            raise ValueError("DiffMultiheadAttention needs an nn.MultiheadAttention with a packed in_proj_weight")
        self.embed_dim, self.num_heads = mha.embed_dim, mha.num_heads
        self.head_dim = mha.head_dim
        self.batch_first = mha.batch_first
        self.dropout = mha.dropout
        self.in_proj_weight = mha.in_proj_weight  # (3D, D), the same Parameter
        self.in_proj_bias = mha.in_proj_bias
        self.out_proj = mha.out_proj
        setattr(self, ADAPTER_ATTR, adapter)

    def _proj(self, x: torch.Tensor, idx: int) -> torch.Tensor:
        D = self.embed_dim
        b = None if self.in_proj_bias is None else self.in_proj_bias[idx * D:(idx + 1) * D]
        return F.linear(x, self.in_proj_weight[idx * D:(idx + 1) * D], b)  # (B, N, D)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise NotImplementedError("DiffMultiheadAttention supports self-attention only (key is query)")
        x = query if self.batch_first else query.transpose(0, 1)  # (B, N, D)
        B, N, _ = x.shape
        ad: RetrofitAdapter = getattr(self, ADAPTER_ATTR)

        def heads(t):
            return t.view(B, N, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, N, d)

        q, k, v = (heads(self._proj(x, i)) for i in range(3))
        q2, k2, v2 = second_branch(ad, x, q, lambda xx, which: heads(self._proj(xx, "qkv".index(which))))
        mask = None
        if attn_mask is not None:
            mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask  # → True = attend
            if mask.dim() == 3:
                mask = mask.view(B, self.num_heads, N, N)
        if key_padding_mask is not None:
            mask = restrict_mask(mask, ~key_padding_mask.bool()[:, None, None, :])  # keep: (B, 1, 1, N)
        out, maps = run_method(ad, q, k, v, q2=q2, k2=k2, v2=v2, scale=self.head_dim**-0.5, attn_mask=mask,
                               is_causal=is_causal, dropout_p=self.dropout if self.training else 0.0,
                               need_weights=need_weights)
        out = self.out_proj(out.transpose(1, 2).reshape(B, N, self.embed_dim))
        if not self.batch_first:
            out = out.transpose(0, 1)
        if maps is not None and average_attn_weights:
            maps = maps.mean(dim=1)
        return out, maps


class OpenClipBinding(BindingBase):
    """Replaces the ``nn.MultiheadAttention`` of every open_clip ``ResidualAttentionBlock``."""

    families = ("open_clip (ResidualAttentionBlock with nn.MultiheadAttention)",)

    def find(self, model: nn.Module) -> list[Candidate]:
        out = []
        for name, m in model.named_modules():
            if (type(m).__module__.startswith("open_clip") and type(m).__name__ == "ResidualAttentionBlock"
                    and isinstance(getattr(m, "attn", None), nn.MultiheadAttention)):
                out.append(Candidate(f"{name}.attn" if name else "attn", m.attn, m, "attn", self))
        return out

    def dims(self, m: nn.MultiheadAttention) -> tuple[int, int, int]:
        return int(m.embed_dim), int(m.num_heads), int(m.head_dim)

    def convert(self, c: Candidate, adapter: RetrofitAdapter) -> nn.Module:
        new = DiffMultiheadAttention(c.module, adapter)
        setattr(c.parent, c.attr, new)
        return new

