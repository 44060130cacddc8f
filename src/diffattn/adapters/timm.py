"""Binding for timm's ``Attention`` (``VisionTransformer`` and every model whose blocks use it).

Each ``timm.layers.Attention`` is converted in place to a subclass (``qkv``, ``q_norm``, ``k_norm``, ``norm``,
``proj`` keep their names, so timm checkpoints load unchanged). The fused ``qkv`` projection is split into Q | K | V
as timm does; DiffQ/K/V run it again on X W_d and keep the part they need (seed 001 App. D.2). ``fused_attn`` picks
``F.scaled_dot_product_attention`` (O(N) memory), otherwise the eager path. ``attn_mask`` (bool, True = attend, or
additive float) and ``is_causal`` are honoured.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .core import ADAPTER_ATTR, Candidate, register_binding
from .methods import INPUT_METHODS, RetrofitAdapter, eager_branch, run_method, sdpa_branch

__all__ = ["TimmDiffAttention"]


def _timm_attention_class():
    try:
        from timm.layers import Attention
    except ImportError:  # pragma: no cover - timm is a dependency
        return None
    return Attention


_BASE = _timm_attention_class()


class TimmDiffAttention(_BASE if _BASE is not None else nn.Module):
    """timm ``Attention`` retrofitted with differential attention (never built directly: see ``retrofit``)."""

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        B, N, _ = x.shape
        ad: RetrofitAdapter = getattr(self, ADAPTER_ATTR)

        def split(t):
            return t.reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

        q, k, v = split(self.qkv(x))  # each (B, h, N, d)
        q, k = self.q_norm(q), self.k_norm(k)
        q2 = k2 = v2 = None
        which = INPUT_METHODS.get(ad.method)
        if which is not None:
            t = split(self.qkv(ad.transform_input(x)))["qkv".index(which)]
            q2 = self.q_norm(t) if which == "q" else None
            k2 = self.k_norm(t) if which == "k" else None
            v2 = t if which == "v" else None
        elif ad.method == "daa":
            q2 = ad.transform_query(q)
        gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
        branch = sdpa_branch if self.fused_attn else eager_branch
        out, _ = run_method(ad, branch, q, k, v, q2=q2, k2=k2, v2=v2, scale=float(self.scale), mask=attn_mask,
                            dropout=self.attn_drop.p if self.training else 0.0, training=self.training,
                            is_causal=is_causal)
        out = out.transpose(1, 2).reshape(B, N, -1)  # (B, N, h·d)
        out = self.norm(out)
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))


class _TimmBinding:
    families = ["timm VisionTransformer (timm.layers.Attention)"]

    def find(self, model: nn.Module) -> list[Candidate]:
        if _BASE is None:
            return []
        out = []
        for name, m in model.named_modules():
            if type(m) is _BASE:
                parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
                out.append(Candidate(name, m, parent, name.rsplit(".", 1)[-1], self))
        return out

    @staticmethod
    def dims(m: nn.Module) -> tuple[int, int, int]:
        return int(m.qkv.in_features), int(m.num_heads), int(m.head_dim)

    @staticmethod
    def convert(c: Candidate, adapter: RetrofitAdapter) -> nn.Module:
        c.module.__class__ = TimmDiffAttention
        setattr(c.module, ADAPTER_ATTR, adapter)
        return c.module


register_binding(_TimmBinding())
