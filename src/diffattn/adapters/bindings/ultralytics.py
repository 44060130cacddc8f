"""Binding for Ultralytics' ``Attention`` (the PSA attention of YOLO11 / YOLO26 ``C2PSA`` and ``C3k2(attn=True)``).

Each ``ultralytics.nn.modules.block.Attention`` is converted in place to a subclass: ``qkv``, ``proj`` and ``pe``
keep their names, so Ultralytics checkpoints (``yolo26n.pt``) load unchanged. The layer works on feature maps
(B, C, H, W): the 1×1 conv ``qkv`` gives per head q, k of width d_k (``key_dim``) and v of width d_v
(``head_dim``) at the N = H·W positions; the output is ``proj(O + pe(V))`` with ``pe`` the 3×3 depthwise
positional conv on the values. The retrofit changes O only: O = the method's attention core
(:func:`diffattn.adapters.methods.run_method`, DAA (2025) / Li et al. 2025), so at step 0 the layer computes the
pretrained function. DiffQ / DiffK / DiffV (DAA (2025) App. D.2) run ``qkv`` again on X W_d (the tokens of X times
W_d, folded back to a map) and keep the part they need; in training mode that second call also updates the batch
statistics of ``qkv``'s BatchNorm, as a second forward of the layer would. Ultralytics is imported only when a model
is searched.
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn

from ...ops import AttentionWeights
from ..binding import ADAPTER_ATTR, BindingBase, Candidate, candidates, optional_class, retrofitted_class
from ..methods import RetrofitAdapter, run_method, second_branch

__all__ = ["UltralyticsBinding", "ultralytics_diff_attention_class", "is_standard_attention",
           "standard_attention_weights"]


def _split(self, x: torch.Tensor):
    """qkv(x) for x (B, C, H, W) as q, k (B, h, N, d_k) and v (B, h, N, d_v)."""
    B, _, H, W = x.shape
    q, k, v = self.qkv(x).view(B, self.num_heads, 2 * self.key_dim + self.head_dim, H * W).split(
        [self.key_dim, self.key_dim, self.head_dim], dim=2)
    return q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1)


@torch.no_grad()
def standard_attention_weights(m: nn.Module, x: torch.Tensor) -> AttentionWeights:
    """The maps of Ultralytics' standard ``Attention`` ``m`` for input ``x`` (B, C, H, W): A_j = softmax(q_jᵀ k_j · s)
    per head j, (B, h, N, N) with N = H·W in row-major order, as ``AttentionWeights(A, None, A)`` (one map: no A2)."""
    q, k, _ = _split(m, x)  # (B, h, N, d_k)
    a = ((q * m.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, h, N, N)
    return AttentionWeights(a, None, a)


def is_standard_attention(m: nn.Module) -> bool:
    """Whether ``m`` is exactly Ultralytics' ``Attention`` (not converted by retrofit); False without ultralytics."""
    if "ultralytics" not in sys.modules:  # an Ultralytics model has imported ultralytics already
        return False
    base = _ultralytics_attention()
    return base is not None and type(m) is base


def _core(self, x: torch.Tensor, need_weights: bool):
    """The retrofit's attention core: O (B, h, N, d_v), the combined map (B, h, N, N) or None, and v."""
    B, C, H, W = x.shape
    ad: RetrofitAdapter = getattr(self, ADAPTER_ATTR)
    q, k, v = _split(self, x)

    def project(tokens: torch.Tensor, which: str) -> torch.Tensor:  # tokens (B, N, C) → heads (B, h, N, ·)
        return _split(self, tokens.transpose(1, 2).reshape(B, C, H, W))["qkv".index(which)]

    tokens = x.flatten(2).transpose(1, 2)  # (B, N, C)
    q2, k2, v2 = second_branch(ad, tokens, q, project)
    out, maps = run_method(ad, q, k, v, q2=q2, k2=k2, v2=v2, scale=float(self.scale), need_weights=need_weights)
    return out, maps, v


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    """Ultralytics ``Attention.forward`` with the retrofit's attention core. x: (B, C, H, W) → (B, C, H, W)."""
    B, C, H, W = x.shape
    out, _, v = _core(self, x, False)
    out = out.transpose(-2, -1).reshape(B, C, H, W)  # channel j·d_v + e = head j, as Ultralytics
    return self.proj(out + self.pe(v.transpose(-2, -1).reshape(B, C, H, W)))


@torch.no_grad()
def _attention_maps(self, x: torch.Tensor) -> torch.Tensor:
    """The combined map of every head for input ``x`` (B, C, H, W): (B, h, N, N), N = H·W in row-major order
    (A1 − λ(t) A2 for DAA / DiffQ / DiffK, A for DiffV / DEX; see ``run_method``)."""
    return _core(self, x, True)[1]


@optional_class
def _ultralytics_attention() -> type:
    from ultralytics.nn.modules.block import Attention

    return Attention


def ultralytics_diff_attention_class() -> type:
    """``UltralyticsDiffAttention``: the subclass of Ultralytics' ``Attention`` a converted module becomes."""
    return retrofitted_class(_ultralytics_attention(), "UltralyticsDiffAttention", "Ultralytics Attention", __name__,
                             forward=_forward, attention_maps=_attention_maps,
                             missing="the ultralytics binding needs ultralytics (pip install 'diffattn[detect]')")


def __getattr__(name: str):
    """``UltralyticsDiffAttention`` as a module attribute, so pickled Ultralytics checkpoints of a retrofitted model
    (``best.pt``) load back (PEP 562)."""
    if name == "UltralyticsDiffAttention":
        return ultralytics_diff_attention_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class UltralyticsBinding(BindingBase):
    """Converts every module whose class is exactly ``ultralytics.nn.modules.block.Attention``."""

    families = ("Ultralytics YOLO (ultralytics.nn.modules.block.Attention, C2PSA / C3k2 attention)",)

    def find(self, model: nn.Module) -> list[Candidate]:
        return candidates(model, self, is_standard_attention)

    def dims(self, m: nn.Module) -> tuple[int, int, int, int]:
        """(D, h, d_k, d_v): channels, heads, query/key head width, value head width."""
        return int(m.num_heads * m.head_dim), int(m.num_heads), int(m.key_dim), int(m.head_dim)

    def retrofitted_class(self, module: nn.Module) -> type:
        return ultralytics_diff_attention_class()
