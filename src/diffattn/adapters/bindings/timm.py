"""Binding for timm's ``Attention`` (``VisionTransformer`` and every model whose blocks use it).

Each ``timm.layers.Attention`` is converted in place to a subclass (``qkv``, ``q_norm``, ``k_norm``, ``norm``,
``proj`` keep their names, so timm checkpoints load unchanged). The fused ``qkv`` projection is split into Q | K | V
as timm does; DiffQ/K/V run it again on X W_d and keep the part they need (DAA (2025) App. D.2). Attention runs
through :func:`diffattn.functional.diff_attention` / ``attention``; ``attn_mask`` (bool, True = attend, or additive
float) and ``is_causal`` are honoured. timm is imported only when a model is searched.
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn

from ..binding import ADAPTER_ATTR, BindingBase, Candidate, candidates, optional_class, retrofitted_class
from ..methods import RetrofitAdapter, run_method, second_branch

__all__ = ["TimmBinding", "timm_diff_attention_class"]


def _forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
    """timm ``Attention.forward`` with the retrofit's second branch. x: (B, N, D) → (B, N, D)."""
    B, N, _ = x.shape
    ad: RetrofitAdapter = getattr(self, ADAPTER_ATTR)

    def split(t):
        return t.reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # 3 × (B, h, N, d)

    def project(xx: torch.Tensor, which: str) -> torch.Tensor:
        t = split(self.qkv(xx))["qkv".index(which)]
        return self.q_norm(t) if which == "q" else self.k_norm(t) if which == "k" else t

    q, k, v = split(self.qkv(x))
    q, k = self.q_norm(q), self.k_norm(k)
    q2, k2, v2 = second_branch(ad, x, q, project)
    gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
    out, _ = run_method(ad, q, k, v, q2=q2, k2=k2, v2=v2, scale=float(self.scale), attn_mask=attn_mask,
                        is_causal=is_causal, dropout_p=self.attn_drop.p if self.training else 0.0)
    out = out.transpose(1, 2).reshape(B, N, -1)  # (B, N, h·d)
    out = self.norm(out)
    if gate is not None:
        out = out * gate
    return self.proj_drop(self.proj(out))


@optional_class
def _timm_attention() -> type:
    from timm.layers import Attention

    return Attention


def timm_diff_attention_class() -> type:
    """``TimmDiffAttention``: the subclass of ``timm.layers.Attention`` a converted module becomes."""
    return retrofitted_class(_timm_attention(), "TimmDiffAttention", "timm Attention", __name__, forward=_forward,
                             missing="the timm binding needs timm (pip install timm)")


class TimmBinding(BindingBase):
    """Converts every module whose class is exactly ``timm.layers.Attention``."""

    families = ("timm VisionTransformer (timm.layers.Attention)",)

    def find(self, model: nn.Module) -> list[Candidate]:
        if "timm" not in sys.modules:  # a timm model has imported timm already
            return []
        base = _timm_attention()
        if base is None:
            return []
        return candidates(model, self, lambda m: type(m) is base)

    def dims(self, m: nn.Module) -> tuple[int, int, int]:
        return int(m.qkv.in_features), int(m.num_heads), int(m.head_dim)

    def retrofitted_class(self, module: nn.Module) -> type:
        return timm_diff_attention_class()
