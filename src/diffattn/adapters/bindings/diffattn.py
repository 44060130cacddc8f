"""Binding for diffattn's own standard attention (:class:`diffattn.layers.Attention`, the layer of every
model with attention of kind ``"standard"``: ViT, CLIP towers, text encoders, causal LMs).

Each module is converted in place to a subclass whose forward runs the retrofit; its parameters (``q_proj``,
``k_proj``, ``v_proj``, ``out_proj``) and their state-dict names stay, so a CLIP converted from open_clip or OpenAI
weights can be retrofitted exactly as the open_clip model was (``diffattn.convert.load_open_clip`` of a retrofitted
open_clip model relies on it). Rotary embeddings, KV caches, sliding windows and soft-capping are not supported by
the retrofitted layer (a ValueError says so before anything is converted).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ...ops import AttentionWeights
from ..binding import ADAPTER_ATTR, BindingBase, Candidate, candidates, retrofitted_class
from ..methods import RetrofitAdapter, run_method, second_branch

__all__ = ["DiffattnBinding", "retrofitted_attention_class"]


def _forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, need_weights: bool = False, *,
             position_ids: torch.Tensor | None = None, kv_cache=None, is_causal: bool | None = None):
    """:class:`diffattn.layers.Attention` forward with the retrofit's second branch. x: (B, N, D) → (B, N, D)."""
    if kv_cache is not None or position_ids is not None:
        raise ValueError("a retrofitted diffattn Attention takes no kv_cache or position_ids (no rotary embedding)")
    self._check_x(x)
    B, N, _ = x.shape
    ad: RetrofitAdapter = getattr(self, ADAPTER_ATTR)

    def project(xx: torch.Tensor, which: str) -> torch.Tensor:
        heads = self.num_heads if which == "q" else self.num_kv_heads
        return getattr(self, f"{which}_proj")(xx).view(B, N, heads, self.head_dim).transpose(1, 2)  # (B, h, N, d)

    q, k, v = project(x, "q"), project(x, "k"), project(x, "v")
    q2, k2, v2 = second_branch(ad, x, q, project)
    causal = self.causal if is_causal is None else is_causal
    out, maps = run_method(ad, q, k, v, q2=q2, k2=k2, v2=v2, scale=float(self.scale), attn_mask=attn_mask,
                           is_causal=causal, dropout_p=self.attn_drop if self.training else 0.0,
                           need_weights=need_weights)
    out = self.proj_drop(self.out_proj(out.transpose(1, 2).reshape(B, N, self.dim)))  # (B, N, D)
    return (out, AttentionWeights(None, None, maps)) if need_weights else out


def _is_attention(m: nn.Module) -> bool:
    """Exactly :class:`diffattn.layers.Attention` (by name: bindings import only the protocol and the methods)."""
    t = type(m)
    return t.__name__ == "Attention" and t.__module__ == "diffattn.layers.attention"


def retrofitted_attention_class(base: type) -> type:
    """``RetrofittedAttention``: the subclass of ``base`` (:class:`diffattn.layers.Attention`) a converted module
    becomes."""
    return retrofitted_class(base, "RetrofittedAttention", "diffattn Attention", __name__, forward=_forward)


class DiffattnBinding(BindingBase):
    """Converts every module whose class is exactly :class:`diffattn.layers.Attention`."""

    families = ("diffattn standard attention (diffattn.layers.Attention)",)

    def find(self, model: nn.Module) -> list[Candidate]:
        return candidates(model, self, _is_attention)

    def dims(self, m: nn.Module) -> tuple[int, int, int]:
        """(D, h, d); a ValueError for the features the retrofitted layer lacks (raised while planning, before any
        module is converted)."""
        unsupported = [n for n, on in (("a rotary embedding", m.rotary is not None), ("softcap", m.softcap is not None),
                                       ("sliding_window", m.sliding_window is not None)) if on]
        if unsupported:
            raise ValueError(f"retrofit of diffattn.layers.Attention does not support {', '.join(unsupported)}; "
                             "build the model with attention={'kind': 'diff'} instead")
        return int(m.dim), int(m.num_heads), int(m.head_dim)

    def retrofitted_class(self, module: nn.Module) -> type:
        return retrofitted_attention_class(type(module))
