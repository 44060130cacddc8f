"""Grouped differential latent attention, GDLA (Motif Technologies 2026, Motif-3): the low-rank query and key/value
projections of multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", arXiv 2405.04434, §2.1) under grouped
differential attention's heads (Motif Technologies 2025, arXiv 2510.06949), with λ per token and head as in Diff
Transformer V2 (Ye et al. 2026) and no sub-norm.

With H = H_s + H_n query heads in H_n groups of r + 1 = H_s/H_n + 1 heads ([signal × r, noise] per group), H_kv
key/value heads, head widths d_nope + d_rope (queries and keys) and d_v (values), s = 1/√(d_nope + d_rope):

    c_q = RMSNorm(x W_qa)                                          (q_lora_rank)
    [Q_nope_h | Q_rope_h] = (c_q W_qb)_h                            (per head: nope first, rope last)
    [c_kv | K_rope] = x W_kva,   c_kv ← RMSNorm(c_kv)               (kv_lora_rank + d_rope; K_rope shared by every head)
    [K_nope_m | V_m] = (c_kv W_kvb)_m                               (m < H_kv)
    Q_rope, K_rope ← RoPE (rotate-half, ``rope_theta``; YaRN's frequencies when ``yarn_factor`` > 1)
    A_h = softmax([Q_nope_h | Q_rope_h] [K_nope_m(h) | K_rope]ᵀ s + M),   m(h) = h // (H / H_kv)
    λ = sigmoid(x W_λ)                                              (B, N, H_s): one per token and signal head
    O_i = A_{sig i} V_{m(sig i)} − λ_i A_{noise g} V_{m(noise g)}   (signal head i of group g = i // r)
    O_i ← O_i ⊙ sigmoid(c_q W_gate)_i                               (``output_gate``; elementwise, width d_v)
    out = out_proj(concat_i O_i)                                    (out_proj: H_s·d_v → dim; no biases anywhere)

This is the attention graph of llama.cpp's Motif-3 model (``src/models/motif3.cpp``, ``build_gdla_attn``, MIT): head
order, pairing, λ, gate and scale are read from it, and ``tests/reference_motif3.py`` transcribes it in float64.
When each group's r + 1 heads read one key/value head ((H / H_kv) a multiple of r + 1, e.g. H_kv dividing H_n) the
two maps of signal head i share their keys and values and the layer makes one call of diffattn's operator,
:func:`~diffattn.functional.diff_attention` (every backend, GQA); otherwise it makes two calls of
:func:`~diffattn.functional.attention` and subtracts (exact either way).

**Latent cache.** Decoding with a KV cache through a layer with ``latent_cache`` and no sliding window stores per
token c_kv and the rotated K_rope (``kv_lora_rank + d_rope`` values, a :class:`~diffattn.layers.KVCache` with one
"head": keys c_kv, values K_rope) instead of H_kv·(d_nope + d_rope + d_v), and attends in the latent space as
DeepSeek-V2 §2.1.2 and llama.cpp do: Q_nope_h W_kb_m(h) (the key half of W_kvb absorbed into the query) against
c_kv, the value half W_vb_m applied after the attention. A sliding-window layer caches its per-head keys and values
(Motif-3 keeps plain GQA caches on its sliding-window layers).

**YaRN.** With ``yarn_factor`` f > 1 the rotated channels use YaRN's frequencies
(:class:`~diffattn.layers.rope.YarnRotaryEmbedding`: ``yarn_original_context``, ``yarn_beta_fast``,
``yarn_beta_slow``) with tables of magnitude 1, and the softmax scale becomes s = m² / √(d_nope + d_rope),
m = 1 + 0.1 · ``yarn_mscale`` · ln f: llama.cpp's Motif-3 graph (``attn_factor`` = 1 / (1 + 0.1 ln f) cancels the
magnitude factor of ggml's ``rope_yarn``; ``kq_scale_full`` = m² / √d), which is DeepSeek-V2's YaRN with ``mscale`` =
``mscale_all_dim``. Motif-3 scales its full-attention layers only; its sliding-window layers keep plain RoPE with
``swa_rope_theta`` (:mod:`diffattn.convert.motif3` builds each layer's setting).

Sliding window: ``sliding_window`` = w lets each query see itself and the w − 1 keys before it (the library's
convention, :func:`~diffattn.ops.sliding_window_mask`); a Hugging Face Motif-3 ``sliding_window`` W is w = W + 1
(:mod:`diffattn.convert.motif3`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..ops import AttentionWeights, attention, compute_dtype, diff_attention, restrict_mask, sliding_window_mask
from .attention import _AttentionBase, _check_int, _positions
from .grouped import paired_queries
from .norm import RMSNorm
from .rope import RotaryEmbedding, YarnRotaryEmbedding, apply_rotary, yarn_softmax_factor
from .spec import AttentionSpec, check_flag, check_positive_float, check_positive_int, register_attention

__all__ = ["GroupedLatentDiffAttention"]


@register_attention
class GroupedLatentDiffAttention(_AttentionBase):
    """Grouped differential latent attention of Motif-3 (module docstring; Motif Technologies 2026).

    Built ``GroupedLatentDiffAttention(dim, num_heads, config, depth=…)`` like every kind: ``num_heads`` is H, the
    signal and noise query heads together (Motif-3's ``num_attention_heads``); the output has H_s = H − H_n heads of
    width d_v. Masks broadcast to (B, H_s, N, Nk); ``need_weights`` returns A1 per signal head, A2 per signal head
    (its group's noise map) and A1 − λ·A2.
    """

    kind = "gdla"
    title = "grouped differential latent"
    differential = True
    head_layout = "branched"
    input_proj = "q_a_proj"

    @dataclass(frozen=True)
    class Config(AttentionSpec):
        """GDLA's settings: those of every kind (:class:`~diffattn.layers.AttentionSpec`) with Motif-3's defaults
        (causal, rotate-half RoPE, no biases: ``qkv_bias`` and ``out_bias`` must stay False), and

        Args:
            num_kv_heads: H_kv, the key/value heads ``kv_b`` expands the latent to; None: H_n (one per group).
            q_lora_rank: width of the query latent c_q; None: dim / 2.
            kv_lora_rank: width of the key/value latent c_kv; None: dim / 2.
            qk_nope_head_dim: the channels of each query/key head without RoPE; None: d − qk_rope_head_dim with
                d = dim / num_heads.
            qk_rope_head_dim: the channels of each query/key head with RoPE (the last ones; shared by every key
                head); None: d / 2 rounded down to an even number.
            v_head_dim: the value head width d_v; None: d.
            num_noise_heads: H_n; None: num_heads / 5 (Motif-3's groups of 4 signal heads and 1 noise head).
            output_gate: the elementwise sigmoid gate on each signal head's output, from the query latent.
            latent_cache: with a KV cache and no sliding window, cache c_kv and K_rope and attend in the latent
                space (module docstring); False: cache per-head keys and values.
            norm_eps: epsilon of the two latent RMSNorms (Motif-3's ``rms_norm_eps``).
            yarn_factor: YaRN's context extension f (module docstring); 1: plain RoPE and s = 1/√d.
            yarn_original_context: the context L the model was trained on before the extension (needed when
                yarn_factor > 1; Hugging Face's ``original_max_position_embeddings``).
            yarn_beta_fast: YaRN's β_fast: pairs turning more than β_fast times over L keep their frequency.
            yarn_beta_slow: YaRN's β_slow: pairs turning fewer than β_slow times over L are divided by f (the ramp
                runs between the two).
            yarn_mscale: the coefficient of ln f in YaRN's attention temperature m (>= 0; 0: m = 1).
        """

        kind: str = "gdla"
        qkv_bias: bool = False
        out_bias: bool = False
        causal: bool = True
        rope: str | None = "half"
        q_lora_rank: int | None = None
        kv_lora_rank: int | None = None
        qk_nope_head_dim: int | None = None
        qk_rope_head_dim: int | None = None
        v_head_dim: int | None = None
        num_noise_heads: int | None = None
        output_gate: bool = True
        latent_cache: bool = True
        norm_eps: float = 1e-6
        yarn_factor: float = 1.0
        yarn_original_context: int | None = None
        yarn_beta_fast: float = 32.0
        yarn_beta_slow: float = 1.0
        yarn_mscale: float = 1.0

        def __post_init__(self) -> None:
            super().__post_init__()
            for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                         "num_noise_heads"):
                check_positive_int(f"attention {name}", getattr(self, name))
            if self.qk_rope_head_dim is not None and self.qk_rope_head_dim % 2:
                raise ValueError(f"attention qk_rope_head_dim must be even (RoPE rotates channel pairs), got "
                                 f"{self.qk_rope_head_dim}")
            check_flag("attention output_gate", self.output_gate)
            check_flag("attention latent_cache", self.latent_cache)
            check_positive_float("attention norm_eps", self.norm_eps)
            for name in ("yarn_factor", "yarn_beta_fast", "yarn_beta_slow"):
                check_positive_float(f"attention {name}", getattr(self, name))
            if self.yarn_mscale != 0.0:  # 0 is allowed: no temperature
                try:
                    check_positive_float("attention yarn_mscale", self.yarn_mscale)
                except ValueError:
                    raise ValueError(f"attention yarn_mscale must be a finite float >= 0, got "
                                     f"{self.yarn_mscale!r}") from None
            check_positive_int("attention yarn_original_context", self.yarn_original_context)
            if self.yarn_factor < 1.0:
                raise ValueError(f"attention yarn_factor must be >= 1 (YaRN extends the context; 1: plain RoPE), "
                                 f"got {self.yarn_factor}")
            if self.yarn_factor > 1.0 and self.yarn_original_context is None:
                raise ValueError(f"attention yarn_factor={self.yarn_factor} needs yarn_original_context (the "
                                 f"context trained on before the extension), got None")
            for name in ("qkv_bias", "out_bias"):
                if getattr(self, name):
                    raise ValueError(f"attention 'gdla' has no biases (Motif-3's projections have none): {name} "
                                     f"must be False, got True")
            if self.rope is None:
                raise ValueError("attention 'gdla' rotates its qk_rope_head_dim channels: rope must be 'half' or "
                                 "'interleaved', got None")

        def sizes(self, dim: int, num_heads: int) -> dict[str, int]:
            """The layer's sizes for width ``dim`` and ``num_heads`` query heads, the defaults filled in (ValueError
            naming the setting when they do not fit together)."""
            _check_int("dim", dim)
            _check_int("num_heads", num_heads, 2)
            hn = num_heads // 5 if self.num_noise_heads is None else self.num_noise_heads
            if self.num_noise_heads is None and (num_heads % 5 or hn == 0):
                raise ValueError(f"attention 'gdla' with num_heads={num_heads} needs num_noise_heads (the default, "
                                 f"num_heads / 5, is Motif-3's groups of 4 signal heads and 1 noise head)")
            hs = num_heads - hn
            if hs < hn or hs % hn:
                raise ValueError(f"attention 'gdla': the signal heads (num_heads − num_noise_heads = {num_heads} − "
                                 f"{hn} = {hs}) must be a positive multiple of num_noise_heads={hn}")
            hkv = hn if self.num_kv_heads is None else self.num_kv_heads
            if num_heads % hkv:
                raise ValueError(f"attention 'gdla': num_heads={num_heads} must be divisible by num_kv_heads={hkv}")
            d = dim // num_heads
            rope = self.qk_rope_head_dim
            if rope is None:
                rope = (d // 2) // 2 * 2
            nope = d - rope if self.qk_nope_head_dim is None else self.qk_nope_head_dim
            if rope < 2 or nope < 1:
                raise ValueError(f"attention 'gdla': dim / num_heads = {d} is too narrow for the default head widths; "
                                 f"give qk_nope_head_dim (>= 1) and qk_rope_head_dim (even, >= 2)")
            dv = d if self.v_head_dim is None else self.v_head_dim
            rq = max(dim // 2, 1) if self.q_lora_rank is None else self.q_lora_rank
            rkv = max(dim // 2, 1) if self.kv_lora_rank is None else self.kv_lora_rank
            return {"noise": hn, "signal": hs, "kv": hkv, "nope": nope, "rope": rope, "v": dv, "q_rank": rq,
                    "kv_rank": rkv}

        def check_heads(self, dim: int, num_heads: int) -> None:
            """The head split and widths (:meth:`sizes`)."""
            self.sizes(dim, num_heads)

    def __init__(self, dim: int, num_heads: int, config: AttentionSpec | Mapping | None = None, *, depth: int = 0,
                 **settings: Any):
        super().__init__()
        config = self.resolve_config(config, settings)
        s = config.sizes(dim, num_heads)
        self.config, self.depth = config, depth
        self.dim, self.num_heads, self.num_kv_heads = dim, num_heads, s["kv"]
        self.num_signal_heads, self.num_noise_heads = s["signal"], s["noise"]
        self.group_ratio = s["signal"] // s["noise"]
        self.diff_heads = s["signal"]  # one differential head per signal head (what the diagnostics count)
        self.q_heads = num_heads
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = s["nope"], s["rope"], s["v"]
        self.head_dim = s["nope"] + s["rope"]  # the query/key width the softmax scale reads
        self.q_lora_rank, self.kv_lora_rank = s["q_rank"], s["kv_rank"]
        self.inner_dim = s["signal"] * s["v"]
        self.causal, self.backend, self.attn_drop = config.causal, config.backend, config.attn_drop
        self.softcap, self.sliding_window = config.softcap, config.sliding_window
        self.scale = self.head_dim**-0.5 * yarn_softmax_factor(config.yarn_factor, config.yarn_mscale)
        eps = float(config.norm_eps)
        self.q_a_proj = nn.Linear(dim, self.q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(self.q_lora_rank, eps=eps)
        self.q_b_proj = nn.Linear(self.q_lora_rank, num_heads * self.head_dim, bias=False)
        self.kv_a_proj = nn.Linear(dim, self.kv_lora_rank + self.qk_rope_head_dim, bias=False)
        self.kv_a_norm = RMSNorm(self.kv_lora_rank, eps=eps)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, self.num_kv_heads * (self.qk_nope_head_dim + self.v_head_dim),
                                   bias=False)
        self.lambda_proj = nn.Linear(dim, self.num_signal_heads, bias=False)
        self.gate_proj = nn.Linear(self.q_lora_rank, self.inner_dim, bias=False) if config.output_gate else None
        self.out_proj = nn.Linear(self.inner_dim, dim, bias=False)
        self.proj_drop = nn.Dropout(config.proj_drop)
        if config.yarn_factor > 1.0:
            self.rotary = YarnRotaryEmbedding(
                self.qk_rope_head_dim, base=config.rope_theta, style=config.rope, factor=config.yarn_factor,
                original_context=config.yarn_original_context, beta_fast=config.yarn_beta_fast,
                beta_slow=config.yarn_beta_slow)
        else:
            self.rotary = RotaryEmbedding(self.qk_rope_head_dim, base=config.rope_theta, style=config.rope)
        # the key/value head each signal head and its group's noise head read (llama.cpp's GQA: h // (H / H_kv))
        per_kv, r = num_heads // self.num_kv_heads, self.group_ratio
        sig = [g * (r + 1) + j for g in range(self.num_noise_heads) for j in range(r)]
        self._kv_signal = [h // per_kv for h in sig]
        self._kv_noise = [(i // r * (r + 1) + r) // per_kv for i in range(self.num_signal_heads)]
        self.shares_kv = self._kv_signal == self._kv_noise  # one operator call (module docstring)

    def extra_repr(self) -> str:
        return (f"signal_heads={self.num_signal_heads}, noise_heads={self.num_noise_heads}, "
                f"kv_heads={self.num_kv_heads}, q_lora_rank={self.q_lora_rank}, kv_lora_rank={self.kv_lora_rank}, "
                f"qk_head_dim={self.qk_nope_head_dim}+{self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}, "
                f"output_gate={self.gate_proj is not None}, sliding_window={self.sliding_window}"
                + (f", yarn_factor={self.config.yarn_factor}" if self.config.yarn_factor > 1.0 else ""))

    @property
    def uses_latent_cache(self) -> bool:
        """Whether a KV cache given to this layer holds the latent (c_kv, K_rope) rather than per-head K and V."""
        return bool(self.config.latent_cache) and self.sliding_window is None

    def cache_width(self) -> int:
        """Values cached per token by this layer: kv_lora_rank + d_rope with the latent cache, else
        H_kv·(d_nope + d_rope + d_v)."""
        if self.uses_latent_cache:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.num_kv_heads * (self.head_dim + self.v_head_dim)

    def lambda_weights(self, x: torch.Tensor) -> tuple[float, torch.Tensor]:
        """(weight1, λ) = (1, sigmoid(x W_λ)) with λ of shape (B, H_s, N, 1): one per token and signal head."""
        return 1.0, torch.sigmoid(self.lambda_proj(x)).transpose(1, 2).unsqueeze(-1)

    def _kv_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_kvb split per key/value head: the key half (H_kv, d_nope, r_kv) and the value half (H_kv, d_v, r_kv)."""
        w = self.kv_b_proj.weight.view(self.num_kv_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]

    def _forward(self, x, attn_mask, need_weights, position_ids, kv_cache, is_causal):
        """``forward`` (every kind's: ``_AttentionBase.forward``) after its checks, masks broadcastable to
        (B, H_s, N, Nk). With ``kv_cache`` on a layer that :attr:`uses_latent_cache`, the cache holds (c_kv, K_rope)
        and the layer attends in the latent space."""
        B, N, _ = x.shape
        H, dn, dr = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        c_q = self.q_a_norm(self.q_a_proj(x))  # (B, N, q_lora_rank)
        q = self.q_b_proj(c_q).view(B, N, H, dn + dr).transpose(1, 2)  # (B, H, N, d_nope + d_rope)
        q_nope, q_rope = q.split([dn, dr], dim=-1)
        c_kv, k_rope = self.kv_a_proj(x).split([self.kv_lora_rank, dr], dim=-1)
        c_kv = self.kv_a_norm(c_kv)  # (B, N, kv_lora_rank)
        cos, sin = self.rotary(_positions(position_ids, kv_cache, N, x.device), dtype=compute_dtype(q.dtype))
        q_rope = apply_rotary(q_rope, cos, sin, self.rotary.style)
        k_rope = apply_rotary(k_rope.unsqueeze(1), cos, sin, self.rotary.style)  # (B, 1, N, d_rope)

        latent = kv_cache is not None and self.uses_latent_cache
        w_k, w_v = self._kv_b()
        if latent:  # DeepSeek-V2 §2.1.2: W_kb absorbed into the query, W_vb after the attention
            c_all, k_rope_all = kv_cache.update(c_kv.unsqueeze(1), k_rope)  # (B, 1, Nk, r_kv), (B, 1, Nk, d_rope)
            q_abs = torch.einsum("bhnd,hdr->bhnr", q_nope, w_k.repeat_interleave(H // self.num_kv_heads, dim=0))
            q = torch.cat([q_abs, q_rope], dim=-1)  # (B, H, N, r_kv + d_rope)
            k = torch.cat([c_all, k_rope_all], dim=-1)  # (B, 1, Nk, r_kv + d_rope)
            v = c_all
        else:
            kv = self.kv_b_proj(c_kv).view(B, N, self.num_kv_heads, dn + self.v_head_dim).transpose(1, 2)
            k_nope, v = kv.split([dn, self.v_head_dim], dim=-1)  # (B, H_kv, N, d_nope), (B, H_kv, N, d_v)
            q = torch.cat([q_nope, q_rope], dim=-1)
            k = torch.cat([k_nope, k_rope.expand(B, self.num_kv_heads, N, dr)], dim=-1)
            if kv_cache is not None:
                k, v = kv_cache.update(k, v)
        causal = self.causal if is_causal is None else is_causal
        if self.sliding_window is not None:
            attn_mask = restrict_mask(attn_mask, sliding_window_mask(N, k.shape[2], self.sliding_window, x.device))
        _, lam = self.lambda_weights(x)
        up = w_v if latent else None
        drop = self.attn_drop if self.training else 0.0
        out, _ = self._attend(q, k, v, lam, up, attn_mask, causal, drop, False)  # (B, H_s, N, d_v)
        weights = self._attend(q, k, v, lam, up, attn_mask, causal, 0.0, True)[1] if need_weights else None
        out = out.transpose(1, 2).reshape(B, N, self.inner_dim)
        if self.gate_proj is not None:
            out = out * torch.sigmoid(self.gate_proj(c_q))
        out = self.proj_drop(self.out_proj(out))
        return (out, weights) if need_weights else out

    def _attend(self, q, k, v, lam, up, attn_mask, causal, drop, need_weights):
        """The signal heads' outputs (B, H_s, N, d_v) from all H query heads ``q`` (groups [signal × r, noise]), keys
        ``k`` and values ``v`` (per key/value head, or the latent's one head with ``up`` = W_vb (H_kv, d_v, r_kv))."""
        q1, q2 = paired_queries(q, self.num_noise_heads)  # (B, H_s, N, ·) each: signal head i meets noise head i // r
        kwargs = self._operator_args(attn_mask, causal, drop, need_weights)
        sig, noise = self._kv_signal, self._kv_noise
        if self.shares_kv:  # each signal head's two maps read one key/value head: diffattn's operator, once
            res = diff_attention(q1, k, q2, k, v, lam, **kwargs)
            out, weights = res if need_weights else (res, None)
            if up is not None:
                out = torch.einsum("bhnr,hdr->bhnd", out, up[sig])
            return out, weights
        if k.shape[1] > 1:  # per-head keys and values: the signal and noise heads of a group read different ones
            i1, i2 = (torch.tensor(ix, device=k.device) for ix in (sig, noise))
            k1, v1, k2, v2 = k[:, i1], v[:, i1], k[:, i2], v[:, i2]
        else:
            k1 = k2 = k
            v1 = v2 = v
        res1 = attention(q1, k1, v1, **kwargs)
        res2 = attention(q2, k2, v2, **kwargs)
        (o1, a1), (o2, a2) = (res1, res2) if need_weights else ((res1, None), (res2, None))
        if up is not None:
            o1 = torch.einsum("bhnr,hdr->bhnd", o1, up[sig])
            o2 = torch.einsum("bhnr,hdr->bhnd", o2, up[noise])
        out = o1 - lam.to(o2.dtype) * o2
        weights = AttentionWeights(a1, a2, a1 - lam.to(a1.dtype) * a2) if need_weights else None
        return out, weights
