"""Grouped differential attention, GDA (Motif Technologies 2025, "Grouped Differential Attention",
arXiv 2510.06949; the attention of Motif-2-12.7B, Motif Technologies 2025, arXiv 2511.07464).

Differential attention (Ye et al. 2024, eq. 1) with fewer noise heads than signal heads: H_s signal heads and
H_n noise heads, r = H_s / H_n, every noise head shared by a group of r signal heads, as grouped-query attention
shares a key/value head. With d the head width, H_kv key/value heads (even) and s = 1/√d:

    Q_head layout: H_n groups of r + 1 heads, [signal × r, noise]          (q_proj: dim → (H_s + H_n)·d)
    K heads 2m (signal keys) and 2m + 1 (noise keys), V_m = V heads (2m, 2m + 1) of width 2d   (m < H_kv/2)
    signal head i reads m = i // (H_s / (H_kv/2)), noise head j reads m = j // (H_n / (H_kv/2))
    A1_i = softmax(Q_sig_i K_{2m}ᵀ s),   A2_j = softmax(Q_noise_j K_{2m+1}ᵀ s)
    O_i = (1 − λ_init) · RMSNorm((A1_i − λ A2_{i // r}) V_m)        (RMSNorm per head, width 2d)
    out = out_proj(concat_i O_i)                                     (out_proj: 2·H_s·d → dim)

Signal head i and its noise head i // r read the same key/value head m. λ is the re-parameterised λ of Ye et al.
(eq. 2) shared by the layer (one value, as the released Motif-2-12.7B and vLLM's ``grouped_diff_attn.py`` backend
compute it); a λ form with one value per head (``lambda_options={"per_head": True}``) or per token gives one per
noise head, i.e. per group. With r = 1 (H_n = H_s) the layout is the adjacent pairing of
:class:`~diffattn.layers.DiffAttention` and the layer computes exactly what DiffAttention computes with the same
weights (the same operator call).

For r > 1 the operator (:func:`~diffattn.functional.diff_attention`, every backend, the decode path, GQA) is given
each noise query once per signal head of its group: the result is exact, but the noise maps cost what H_s maps
cost, not H_n (the FLOP saving of the paper needs a kernel that reads each noise map once; not done here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..ops import diff_attention, diff_attention_pairs
from .attention import HeadDimConfig, _check_int, _PairedDiffBase
from .norm import scaled_rms_norm
from .spec import AttentionSpec, check_positive_int, register_attention

__all__ = ["GroupedDiffAttention", "gda_head_split"]


def gda_head_split(q: torch.Tensor, num_noise_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H_s + H_n, N, d) in the grouped layout ([signal × r, noise] per group) → (signal (B, H_s, N, d),
    noise (B, H_n, N, d))."""
    B, H, N, d = q.shape
    g = q.unflatten(1, (num_noise_heads, H // num_noise_heads))  # (B, H_n, r + 1, N, d)
    return g[:, :, :-1].flatten(1, 2), g[:, :, -1]


def paired_queries(q: torch.Tensor, num_noise_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H_s + H_n, N, d) in the grouped layout → (signal queries (B, H_s, N, d), the noise query each signal
    head meets (B, H_s, N, d): noise head i // r for signal head i, r = H_s / H_n)."""
    q1, q2 = gda_head_split(q, num_noise_heads)
    return q1, q2.repeat_interleave(q1.shape[1] // num_noise_heads, dim=1)


def _per_signal_head(w, ratio: int, noise_heads: int):
    """A weight broadcastable to (B, H_n, N, 1) (one per noise head / group) → one per signal head."""
    if isinstance(w, torch.Tensor) and w.dim() >= 3 and w.shape[-3] == noise_heads and noise_heads > 1:
        return w.repeat_interleave(ratio, dim=-3)
    return w


@register_attention
class GroupedDiffAttention(_PairedDiffBase):
    """Grouped differential attention (module docstring): H_s signal heads, H_n noise heads shared by groups of
    r = H_s / H_n signal heads (Motif Technologies 2025, arXiv 2510.06949).

    Args:
        dim: model width.
        num_heads: query heads of width d in ``q_proj``, signal and noise together (H_s + H_n; Motif's
            ``num_attention_heads``).
        config: the kind's :class:`Config` (or its dict; keyword settings are its fields). Its
            ``num_noise_heads`` is H_n (Motif's ``num_noise_heads``), by default ``num_heads / 2``, which is
            :class:`~diffattn.layers.DiffAttention`; H_s = num_heads − H_n must be a multiple of H_n. Its
            ``head_dim`` is d, by default dim / num_heads. Its ``num_kv_heads`` counts the key/value heads of width
            d (even): H_kv/2 signal keys, H_kv/2 noise keys, H_kv/2 values of width 2d; default 2·H_n. H_s and
            H_n must be multiples of H_kv/2. The other settings are those of
            :class:`~diffattn.layers.attention.DiffConfig` (λ form, sub-norm) and of every kind (RoPE, backend,
            soft-capping, sliding window).
        depth: the block's 0-based index (for λ_init by depth).

    Masks broadcast to (B, H_s, N, Nk); ``need_weights`` returns A2 per signal head (each noise map repeated r
    times).
    """

    kind = "grouped"
    title = "grouped differential"

    @dataclass(frozen=True)
    class Config(HeadDimConfig):
        """Grouped differential attention's settings: those of :class:`~diffattn.layers.attention.HeadDimConfig`
        (:class:`~diffattn.layers.attention.DiffConfig` and ``head_dim``) and

        Args:
            num_noise_heads: H_n, the noise heads, each shared by a group of r = (num_heads − H_n) / H_n signal
                heads (any ratio r ≥ 1); None: num_heads / 2 (r = 1, differential attention).
        """

        kind: str = "grouped"
        num_noise_heads: int | None = None

        def __post_init__(self) -> None:
            super().__post_init__()
            check_positive_int("attention num_noise_heads", self.num_noise_heads)
            if self.num_noise_heads is not None and self.num_kv_heads is not None and (
                    self.num_kv_heads % 2 or self.num_noise_heads % (self.num_kv_heads // 2)):
                raise ValueError(f"attention 'grouped' reads H_kv/2 signal keys, H_kv/2 noise keys and H_kv/2 "
                                 f"values: num_kv_heads={self.num_kv_heads} must be even and num_noise_heads="
                                 f"{self.num_noise_heads} a multiple of num_kv_heads/2")

        def check_heads(self, dim: int, num_heads: int) -> None:
            """The head width (``head_dim`` or dim / num_heads) and the split of the query heads into
            num_heads − H_n signal heads in groups of r = (num_heads − H_n) / H_n per noise head."""
            _check_int("dim", dim)
            _check_int("num_heads", num_heads, 2)
            noise = num_heads // 2 if self.num_noise_heads is None else self.num_noise_heads
            if self.num_noise_heads is None and num_heads % 2:
                raise ValueError(f"attention 'grouped' with num_heads={num_heads} (odd) needs num_noise_heads (the "
                                 f"default, num_heads / 2, is differential attention)")
            signal = num_heads - noise
            if signal < noise or signal % noise:
                raise ValueError(f"attention 'grouped': the signal heads (num_heads − num_noise_heads = {num_heads} "
                                 f"− {noise} = {signal}) must be a positive multiple of num_noise_heads={noise}, "
                                 f"each noise head serving a group of signal heads")
            kv = 2 * noise if self.num_kv_heads is None else self.num_kv_heads
            if kv % 2 or signal % (kv // 2) or noise % (kv // 2):
                raise ValueError(f"attention 'grouped': num_kv_heads={kv} must be even, with the signal heads "
                                 f"({signal}) and the noise heads ({noise}) multiples of num_kv_heads/2")
            if self.head_dim is None and dim % num_heads:
                raise ValueError(f"attention 'grouped': dim={dim} must be divisible by num_heads={num_heads}, or "
                                 f"give head_dim")

    def __init__(self, dim: int, num_heads: int, config: AttentionSpec | Mapping | None = None, *, depth: int = 0,
                 **settings: Any):
        super().__init__()
        config = self.resolve_config(config, settings)
        config.check_heads(dim, num_heads)
        num_noise_heads = num_heads // 2 if config.num_noise_heads is None else config.num_noise_heads
        signal = num_heads - num_noise_heads
        head_dim = dim // num_heads if config.head_dim is None else config.head_dim
        if config.num_kv_heads is None:
            config_kv = config.updated({"num_kv_heads": 2 * num_noise_heads})
        else:
            config_kv = config
        # the projections of a differential layer with 2·H_s query heads (out_proj: 2·H_s·d → dim, V as H_kv/2
        # heads of width 2d); q_proj is then rebuilt for the H_s + H_n query heads of GDA
        self._setup(dim, 2 * signal, config_kv, paired=True, v_head_mult=2, head_dim=head_dim)
        self.config = config
        self.num_heads = self.q_heads = num_heads
        self.q_proj = nn.Linear(dim, num_heads * head_dim, bias=config.qkv_bias)
        self.num_signal_heads, self.num_noise_heads = signal, num_noise_heads
        self.group_ratio = signal // num_noise_heads
        self.diff_heads = signal
        self._setup_lambda(config, dim=dim, depth=depth, heads=num_noise_heads, norm_width=2 * head_dim)

    def extra_repr(self) -> str:
        return (f"signal_heads={self.num_signal_heads}, noise_heads={self.num_noise_heads}, "
                f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, lambda_init={self.lambda_init:.6g}")

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        weight1, lam = self.lambda_weights(x)
        kwargs = self._operator_args(attn_mask, causal, drop, need_weights)
        if self.group_ratio == 1:  # [signal, noise] pairs: DiffAttention's layout and call
            res = diff_attention_pairs(q, k, v, lam, weight1=weight1, **kwargs)
        else:
            r, hn = self.group_ratio, self.num_noise_heads
            q1, q2 = paired_queries(q, hn)  # (B, H_s, N, d) each: signal head i meets noise head i // r
            k1, k2 = k[:, 0::2], k[:, 1::2]  # (B, H_kv/2, Nk, d) each
            res = diff_attention(q1, k1, q2, k2, v, _per_signal_head(lam, r, hn),
                                 weight1=_per_signal_head(weight1, r, hn), **kwargs)
        out, weights = res if need_weights else (res, None)
        return scaled_rms_norm(out, self.diff_norm, self.out_scale), weights  # (B, H_s, N, 2d)
