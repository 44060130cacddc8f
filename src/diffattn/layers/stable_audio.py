"""Stable Audio 3's differential attention (Stability AI 2026, "Stable Audio 3", arXiv 2605.17991): self- and
cross-attention of its DiT with λ fixed at 1, no sub-norm, an RMS QK-norm and a partial rotary embedding.

With h heads of width d = dim / h, s = 1/√d and RMSNorm over each head's d channels (learnt scale, eps 1e-6):

    Q_b = RMSNorm_q(x W_Qb),  K_b = RMSNorm_k(c W_Kb),  V = c W_V      (b = 1, 2; c = x, or the context)
    Q_b, K_b ← RoPE on their first r = d · rotary_fraction channels     (self-attention only; SA3: r = d/2)
    O_i = (A(Q1_i, K1_i) − A(Q2_i, K2_i)) V_i,   A(Q, K) = softmax(Q Kᵀ s + M)
    out = out_proj(concat_i O_i)                                         (no bias in SA3)

The two branches share the QK-norm of their role (one ``q_norm``, one ``k_norm``), V has heads of width d (one per
output head), and nothing scales or normalises the difference: w1 = λ = 1 in
:func:`~diffattn.functional.diff_attention`. This is the attention of diffusers' ``StableAudio3DiTModel``
(``use_differential_attention=True``), whose processors run the two maps as two calls;
:mod:`diffattn.adapters.diffusers` runs them through diffattn's operator instead and
:mod:`diffattn.convert.stable_audio` maps the weights of its modules onto this layer.

Layout of the layer (the library's adjacent pairing, §2 of the design notes): ``q_proj`` dim → 2h·d and
``k_proj`` context_dim → 2h_kv·d are viewed as 2h (2h_kv) heads of width d, head pair (2i, 2i+1) holding
(Q1_i, Q2_i) and (K1_i, K2_i); ``v_proj`` context_dim → h_kv·d; ``out_proj`` h·d → dim. ``head_layout`` is
therefore ``"paired"`` (each map has its own query and key heads, side by side), with values of width d rather than
2d: the value heads are the output heads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..ops import AttentionWeights, diff_attention, upcast
from .attention import _AttentionBase, _positions
from .kv_cache import KVCache
from .norm import RMSNorm
from .rope import RotaryEmbedding, apply_rotary
from .spec import AttentionSpec, check_flag, check_positive_float, check_positive_int, register_attention

__all__ = ["StableAudioAttention", "rotary_width"]


def rotary_width(head_dim: int, rotary_fraction: float) -> int:
    """The channels r = head_dim · rotary_fraction of each head the rotary embedding rotates (the first ones).
    ValueError unless r is a whole, even number of channels in [2, head_dim]."""
    r = head_dim * rotary_fraction
    if not (math.isclose(r, round(r)) and round(r) >= 2 and round(r) % 2 == 0 and round(r) <= head_dim):
        raise ValueError(f"attention rotary_fraction={rotary_fraction} of head width d={head_dim} gives {r:g} "
                         f"channels; the rotary embedding needs a whole, even number of channels in [2, d]")
    return int(round(r))


@register_attention
class StableAudioAttention(_AttentionBase):
    """Stable Audio 3's differential self- and cross-attention (module docstring; Stability AI 2026, arXiv
    2605.17991, as diffusers' ``StableAudio3SelfAttention`` / ``StableAudio3CrossAttention`` compute it).

    Built ``StableAudioAttention(dim, num_heads, config, depth=…)`` like every kind: ``num_heads`` is h, the output
    heads, each with two maps (as :class:`~diffattn.layers.DiffAttentionV2`, not the h/2 differential heads of
    :class:`~diffattn.layers.DiffAttention`). ``forward(x)`` is self-attention; ``forward(x, context=c)`` is
    cross-attention from x to c (B, M, context_dim), without the rotary embedding (SA3's context tokens have no
    position relative to the latents), ``attn_mask`` then masking keys of c (SA3's ``context_mask`` (B, M) is
    ``attn_mask=context_mask[:, None, None, :]``).
    """

    kind = "stable_audio"
    title = "Stable Audio 3 differential"
    differential = True
    head_layout = "paired"

    @dataclass(frozen=True)
    class Config(AttentionSpec):
        """Stable Audio 3 attention's settings: those of every kind (:class:`~diffattn.layers.AttentionSpec`), with
        SA3's defaults (no q/k/v or output bias, the rotate-half rotary embedding), and

        Args:
            qk_norm: the RMS QK-norm over each head's d channels (learnt scale; one for Q1 and Q2, one for K1 and
                K2).
            qk_norm_eps: its epsilon (SA3: 1e-6).
            rotary_fraction: the fraction of each head's channels, the first ones, that the rotary embedding
                rotates (partial RoPE; SA3: 0.5).
            context_dim: the width of the context that cross-attention projects keys and values from; None: dim
                (the layer then serves self- and cross-attention).
        """

        kind: str = "stable_audio"
        qkv_bias: bool = False
        out_bias: bool = False
        rope: str | None = "half"
        qk_norm: bool = True
        qk_norm_eps: float = 1e-6
        rotary_fraction: float = 0.5
        context_dim: int | None = None

        def __post_init__(self) -> None:
            super().__post_init__()
            check_flag("attention qk_norm", self.qk_norm)
            check_positive_float("attention qk_norm_eps", self.qk_norm_eps)
            check_positive_float("attention rotary_fraction", self.rotary_fraction)
            if self.rotary_fraction > 1:
                raise ValueError(f"attention rotary_fraction must be in (0, 1], got {self.rotary_fraction!r}")
            check_positive_int("attention context_dim", self.context_dim)

    def __init__(self, dim: int, num_heads: int, config: AttentionSpec | Mapping | None = None, *, depth: int = 0,
                 **settings: Any):
        super().__init__()
        config = self.resolve_config(config, settings)
        self._setup(dim, num_heads, config, paired=False, q_heads_per_head=2)
        self.depth = depth
        self.diff_heads = num_heads  # one differential head per output head (what the diagnostics count)
        self.context_dim = dim if config.context_dim is None else config.context_dim
        d = self.head_dim
        # keys: K1 and K2 of each key/value head side by side; keys and values read the context's width
        self.k_proj = nn.Linear(self.context_dim, 2 * self.num_kv_heads * d, bias=config.qkv_bias)
        if self.context_dim != dim:
            self.v_proj = nn.Linear(self.context_dim, self.num_kv_heads * d, bias=config.qkv_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(d, eps=float(config.qk_norm_eps))
            self.k_norm = RMSNorm(d, eps=float(config.qk_norm_eps))
        else:
            self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.diff_norm, self.out_scale = nn.Identity(), 1.0  # no sub-norm, no (1 − λ_init) scale
        if self.rotary is not None:
            self.rotary = RotaryEmbedding(rotary_width(d, config.rotary_fraction), base=config.rope_theta,
                                          style=config.rope)

    def lambda_weights(self, x: torch.Tensor) -> tuple[float, float]:
        """(weight1, λ) = (1, 1) for every input: SA3 subtracts the second map unscaled."""
        return 1.0, 1.0

    def _norm(self, norm: nn.Module, t: torch.Tensor) -> torch.Tensor:
        """The QK-norm in ≥ float32, returned in t's dtype (SA3 computes it in float32 for half-precision inputs)."""
        return norm(upcast(t)).to(t.dtype)

    def _rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE on the first r channels of each head, the rest passed through."""
        r = self.rotary.head_dim
        return torch.cat([apply_rotary(t[..., :r], cos, sin, self.rotary.style), t[..., r:]], dim=-1)

    def _project(self, x, position_ids, kv_cache, context=None):
        """(q (B, 2h, N, d), k (B, 2h_kv, M, d), v (B, h_kv, M, d), None): the base's four, without the query
        projection (``q_lin``) that only the gated kind's output reads."""
        B, N, _ = x.shape
        d = self.head_dim
        src = x if context is None else context
        M = src.shape[1]
        q = self._norm(self.q_norm, self.q_proj(x).view(B, N, self.q_heads, d).transpose(1, 2))  # (B, 2h, N, d)
        k = self._norm(self.k_norm, self.k_proj(src).view(B, M, 2 * self.num_kv_heads, d).transpose(1, 2))
        v = self.v_proj(src).view(B, M, self.num_kv_heads, d).transpose(1, 2)  # (B, h_kv, M, d)
        if self.rotary is not None and context is None:
            cos, sin = self.rotary(_positions(position_ids, kv_cache, N, x.device), dtype=upcast(q).dtype)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        return q, k, v, None

    def _check_context(self, x: torch.Tensor, context, position_ids, kv_cache) -> None:
        if context is None:
            if self.context_dim != self.dim:
                raise ValueError(f"this layer projects keys and values from a context of width context_dim="
                                 f"{self.context_dim} (dim={self.dim}); call it with context= (B, M, "
                                 f"{self.context_dim})")
            return
        if not isinstance(context, torch.Tensor) or context.dim() != 3 or context.shape[-1] != self.context_dim \
                or context.shape[0] != x.shape[0]:
            got = tuple(context.shape) if isinstance(context, torch.Tensor) else type(context).__name__
            raise ValueError(f"context must be a tensor of shape (B={x.shape[0]}, M, context_dim={self.context_dim}),"
                             f" got {got}")
        if context.dtype != x.dtype or context.device != x.device:
            raise ValueError(f"context must have x's dtype and device ({x.dtype}, {x.device}), got "
                             f"({context.dtype}, {context.device})")
        if kv_cache is not None:
            raise ValueError("kv_cache is for self-attention; a cross-attention call (context=...) projects its keys "
                             "and values from the context at every call, got kv_cache and context")
        if position_ids is not None:
            raise ValueError("position_ids place the rotary embedding of self-attention; cross-attention "
                             "(context=...) has none, got position_ids and context")

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, need_weights: bool = False, *,
                context: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                kv_cache: KVCache | None = None, is_causal: bool | None = None,
                ) -> torch.Tensor | tuple[torch.Tensor, AttentionWeights]:
        """x: (B, N, dim) → (B, N, dim); the arguments of every kind's forward (``_AttentionBase.forward``), and

        context: (B, M, context_dim) for cross-attention from x to it (keys and values from the context, no
            rotary embedding; ``attn_mask`` broadcastable to (B, h, N, M)); None: self-attention.
        """
        self._check_x(x)
        self._check_context(x, context, position_ids, kv_cache)
        return self._forward(x, attn_mask, need_weights, position_ids, kv_cache, is_causal, context=context)

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        # Q/K heads 2i and 2i+1 are the two maps of head i; λ = 1 (and w1 = 1): A1 − A2, no sub-norm
        res = diff_attention(q[:, 0::2], k[:, 0::2], q[:, 1::2], k[:, 1::2], v, 1.0,
                             **self._operator_args(attn_mask, causal, drop, need_weights))
        return res if need_weights else (res, None)
