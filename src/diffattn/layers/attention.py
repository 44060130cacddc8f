"""Attention layers with one constructor and forward interface: standard, differential and gated differential.

A model switches attention by name (:func:`attention_class`) and gets a fair comparison: same projections, same
rotary embedding and KV cache, same masks.

    x ─ q_proj/k_proj/v_proj ─ (RoPE) ─ (KV cache) ─ attend ─ concat heads ─ out_proj ─ dropout

Differential layers follow seed 003's module (DiffCLIP's code) for names and layout: ``num_heads`` is the standard
head count h (even), H = h/2 differential heads, head width d = dim/h, Q and K viewed as 2H heads of width d, V as H
heads of width 2d, differential head i pairing Q/K heads 2i and 2i+1 ("adjacent" layout).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..functional import BACKENDS, AttentionWeights, _upcast, attention, diff_attention
from ..lambdas import LAMBDA_FORMS, build_lambda, reparam_lambda, resolve_lambda_init
from .kv_cache import KVCache
from .norm import head_rms_norm
from .rope import ROPE_STYLES, RotaryEmbedding, apply_rotary

__all__ = ["Attention", "DiffAttention", "GatedDiffAttention", "ATTENTION_TYPES", "attention_class"]


def _check_int(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


class _AttentionBase(nn.Module):
    """Projections, rotary embedding, KV cache and output path shared by the three layers."""

    q_heads: int  # heads of width head_dim in q_proj's output
    kv_heads: int  # heads of width head_dim in k_proj's output
    v_head_dim: int  # width of one value head

    def _setup(self, dim, num_heads, num_kv_heads, qkv_bias, out_bias, causal, attn_drop, proj_drop, backend,
               rope, rope_theta, *, paired: bool) -> None:
        _check_int("dim", dim)
        _check_int("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        if paired and num_heads % 2:
            raise ValueError(f"num_heads is the standard head count and must be even for differential attention "
                             f"(H = num_heads/2 differential heads), got {num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}")
        if paired and num_kv_heads % 2:
            raise ValueError(f"num_kv_heads must be even for differential attention, got {num_kv_heads}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if rope is not None and rope not in ROPE_STYLES:
            raise ValueError(f"rope must be None or one of {ROPE_STYLES}, got {rope!r}")
        for name, p in (("attn_drop", attn_drop), ("proj_drop", proj_drop)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        self.dim, self.num_heads, self.num_kv_heads = dim, num_heads, num_kv_heads
        self.head_dim = dim // num_heads
        self.causal, self.backend, self.attn_drop = causal, backend, attn_drop
        self.scale = self.head_dim**-0.5
        self.q_proj = nn.Linear(dim, dim, bias=qkv_bias)
        self.k_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(dim, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(dim, dim, bias=out_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        self.rotary = RotaryEmbedding(self.head_dim, base=rope_theta, style=rope) if rope is not None else None
        self.v_head_dim = 2 * self.head_dim if paired else self.head_dim

    def _project(self, x, position_ids, kv_cache):
        B, N, _ = x.shape
        q_lin = self.q_proj(x)  # (B, N, dim)
        q = q_lin.view(B, N, -1, self.head_dim).transpose(1, 2)  # (B, q_heads, N, d)
        k = self.k_proj(x).view(B, N, -1, self.head_dim).transpose(1, 2)  # (B, kv_heads, N, d)
        v = self.v_proj(x).view(B, N, -1, self.v_head_dim).transpose(1, 2)  # (B, v_heads, N, dv)
        if self.rotary is not None:
            if position_ids is None:
                start = kv_cache.length if kv_cache is not None else 0
                position_ids = torch.arange(start, start + N, device=x.device)
            cos, sin = self.rotary(position_ids, dtype=torch.promote_types(q.dtype, torch.float32))
            q = apply_rotary(q, cos, sin, self.rotary.style)
            k = apply_rotary(k, cos, sin, self.rotary.style)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        return q, k, v, q_lin

    def _check_x(self, x):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, N, dim={self.dim}), got {got}")

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        *,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        is_causal: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, AttentionWeights]:
        """x: (B, N, dim) → (B, N, dim).

        attn_mask: bool (True = attend) or additive float, broadcastable to (B, heads, N, Nk), where heads is the
            layer's attention-head count (num_heads for :class:`Attention`, num_heads/2 for differential layers).
        need_weights: also return :class:`~diffattn.functional.AttentionWeights` (A1, A2, combined; for standard
            attention A1 = combined = A and A2 is None).
        position_ids: (N,) or (B, N) positions for the rotary embedding; default continues ``kv_cache``.
        kv_cache: a :class:`KVCache` to append to and attend over (incremental decoding).
        is_causal: overrides the layer's ``causal`` flag; the causal mask is aligned to the end of the cache.
        """
        self._check_x(x)
        B, N, _ = x.shape
        q, k, v, q_lin = self._project(x, position_ids, kv_cache)
        causal = self.causal if is_causal is None else is_causal
        drop = self.attn_drop if self.training else 0.0
        out, weights = self._attend(x, q, k, v, attn_mask, causal, drop, need_weights)  # (B, heads, N, dv)
        out = out.transpose(1, 2).reshape(B, N, self.dim)
        out = self._output(out, q_lin)
        return (out, weights) if need_weights else out

    def _output(self, out, q_lin):
        return self.proj_drop(self.out_proj(out))

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):  # pragma: no cover - abstract
        raise NotImplementedError


class Attention(_AttentionBase):
    """Standard multi-head attention (Vaswani et al. 2017): the baseline, through PyTorch's SDPA kernels.

    O_i = softmax(Q_i K_iᵀ / √d) V_i per head, concat, ``out_proj``. Takes the differential layers' constructor
    arguments (``depth``, ``lambda_init``, ``lambda_form``) so models switch attention by name; they are unused.
    """

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0, lambda_init: float | str = 0.8,
                 lambda_form: str = "reparam", num_kv_heads: int | None = None, qkv_bias: bool = True,
                 out_bias: bool = True, causal: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 backend: str = "auto", rope: str | None = None, rope_theta: float = 10000.0):
        super().__init__()
        if backend == "triton":
            raise ValueError("backend='triton' is for differential attention; Attention takes 'auto', 'math' "
                             "or 'sdpa'")
        self._setup(dim, num_heads, num_kv_heads, qkv_bias, out_bias, causal, attn_drop, proj_drop, backend,
                    rope, rope_theta, paired=False)
        self.depth = depth

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        res = attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=self.scale, dropout_p=drop,
                        backend=self.backend, return_weights=need_weights)
        if need_weights:
            out, a = res
            return out, AttentionWeights(a, None, a)
        return res, None


class DiffAttention(_AttentionBase):
    """Differential attention (Ye et al. 2024 §2.1; DiffCLIP, seed 000 §3.1; seed 003's module).

        [Q1_i; Q2_i] = Q heads (2i, 2i+1),  V_i of width 2d,  A_b = softmax(Q_b_i K_b_iᵀ / √d)
        O_i = (1 − λ_init) · RMSNorm((A1 − λ A2) V_i),   out = out_proj(concat_i O_i)
        λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init   (``lambda_form="reparam"``; λ vectors ~ N(0, 0.1²), fp32)

    ``lambda_init`` is a float (DiffCLIP: 0.8) or ``"ye"``: 0.8 − 0.6·exp(−0.3·depth) with ``depth`` the
    **0-based** layer index (DiffCLIP*). Other λ forms (:mod:`diffattn.lambdas`) live in ``lambda_fn``; the gate
    form is :class:`GatedDiffAttention`. ``token_sigmoid`` (Diff Transformer V2) runs without the sub-norm.
    Parameters: standard attention plus 4d λ values and the 2d norm weight.
    """

    _gated = False

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0, lambda_init: float | str = 0.8,
                 lambda_form: str = "reparam", num_kv_heads: int | None = None, qkv_bias: bool = True,
                 out_bias: bool = True, causal: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 backend: str = "auto", rope: str | None = None, rope_theta: float = 10000.0,
                 lambda_std: float = 0.1, sub_norm: bool | None = None):
        super().__init__()
        self._setup(dim, num_heads, num_kv_heads, qkv_bias, out_bias, causal, attn_drop, proj_drop, backend,
                    rope, rope_theta, paired=True)
        if lambda_form not in LAMBDA_FORMS:
            raise ValueError(f"lambda_form must be one of {LAMBDA_FORMS}, got {lambda_form!r}")
        if lambda_form == "gate" and not self._gated:
            raise ValueError("lambda_form='gate' is M-DGSA: use diffattn.GatedDiffAttention")
        self.depth = depth
        self.lambda_init = resolve_lambda_init(lambda_init, depth)
        self.lambda_form = lambda_form
        self.diff_heads = num_heads // 2
        self.lambda_std = lambda_std
        if lambda_form == "reparam":  # seed 003's names, directly on the module
            self.lambda_q1 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32))
            self.lambda_k1 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32))
            self.lambda_q2 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32))
            self.lambda_k2 = nn.Parameter(torch.zeros(self.head_dim, dtype=torch.float32))
            self.reset_lambda()
        elif lambda_form != "gate":  # the gate lives in GatedDiffAttention.gate_proj
            self.lambda_fn = build_lambda(lambda_form, head_dim=self.head_dim, dim=dim, num_heads=self.diff_heads,
                                          lambda_init=self.lambda_init)
        sub_norm = (lambda_form != "token_sigmoid") if sub_norm is None else sub_norm
        self.diff_norm = head_rms_norm(2 * self.head_dim) if sub_norm else nn.Identity()
        self.out_scale = (1.0 - self.lambda_init) if sub_norm else 1.0

    def reset_lambda(self) -> None:
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(p, mean=0.0, std=self.lambda_std)

    def lambda_weights(self, x: torch.Tensor) -> tuple[float | torch.Tensor, float | torch.Tensor]:
        """(weight1, λ) for input x, each a float or a tensor broadcastable to (B, H, N, 1)."""
        if self.lambda_form == "reparam":
            return 1.0, reparam_lambda(self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2,
                                       self.lambda_init)
        return self.lambda_fn(x)

    def _attend(self, x, q, k, v, attn_mask, causal, drop, need_weights):
        weight1, lam = self.lambda_weights(x)
        res = diff_attention(q[:, 0::2], k[:, 0::2], q[:, 1::2], k[:, 1::2], v, lam, weight1=weight1,
                             attn_mask=attn_mask, is_causal=causal, scale=self.scale, dropout_p=drop,
                             backend=self.backend, return_weights=need_weights)
        out, weights = res if need_weights else (res, None)
        out = self.diff_norm(out) * self.out_scale  # (B, H, N, 2d)
        return out, weights


class GatedDiffAttention(DiffAttention):
    """Multi-head differential gated self-attention, M-DGSA (seed 004 §4, eq. 3 and Algorithm 1).

        g = σ(X W_g + b_g) ∈ (0, 1)^{N×H}                      (``gate_proj``: dim → H, one layer)
        O_i = (1 − λ_init) · RMSNorm((g_i ⊙ A⁺_i − (1 − g_i) ⊙ A⁻_i) V_i)
        out = out_proj(concat_i O_i) [+ [Q⁺; Q⁻]]               (``q_residual``: DGViT uses it, DGT does not)

    g scales the row of its query token, so it commutes with the product by V and the O(N) backends serve it.
    λ_init fixed at 0.8 was best in seed 004 (App. B.5); ``"ye"`` gives Algorithm 1's depth schedule.
    """

    _gated = True

    def __init__(self, dim: int, num_heads: int, *, depth: int = 0, lambda_init: float | str = 0.8,
                 lambda_form: str = "gate", num_kv_heads: int | None = None, qkv_bias: bool = True,
                 out_bias: bool = True, causal: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 backend: str = "auto", rope: str | None = None, rope_theta: float = 10000.0,
                 q_residual: bool = False, gate_bias: bool = True):
        if lambda_form != "gate":
            raise ValueError(f"GatedDiffAttention always uses lambda_form='gate', got {lambda_form!r}")
        super().__init__(dim, num_heads, depth=depth, lambda_init=lambda_init, lambda_form="gate",
                         num_kv_heads=num_kv_heads, qkv_bias=qkv_bias, out_bias=out_bias, causal=causal,
                         attn_drop=attn_drop, proj_drop=proj_drop, backend=backend, rope=rope,
                         rope_theta=rope_theta, sub_norm=True)
        self.q_residual = q_residual
        self.gate_proj = nn.Linear(dim, self.diff_heads, bias=gate_bias)

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """g = σ(X W_g + b_g) as (B, H, N, 1) in float32."""
        return torch.sigmoid(_upcast(self.gate_proj(x))).transpose(1, 2).unsqueeze(-1)

    def lambda_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.gate(x)
        return g, 1.0 - g

    def _output(self, out, q_lin):
        out = self.out_proj(out)
        if self.q_residual:  # + [Q⁺; Q⁻] = X W_Q (before the rotary embedding), (B, N, dim)
            out = out + q_lin
        return self.proj_drop(out)


ATTENTION_TYPES = {"standard": Attention, "diff": DiffAttention, "gated": GatedDiffAttention}


def attention_class(name: str) -> type[nn.Module]:
    """The layer class for ``attention="standard" | "diff" | "gated"``."""
    if name not in ATTENTION_TYPES:
        raise ValueError(f"attention must be one of {tuple(ATTENTION_TYPES)}, got {name!r}")
    return ATTENTION_TYPES[name]
