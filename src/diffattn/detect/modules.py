"""Differential attention modules for Ultralytics YOLO feature maps (B, C, H, W).

- :class:`DiffAttention2d`: the token block. The feature map is flattened to N = H·W tokens of width C, run through
  :class:`diffattn.layers.DiffAttention` (Ye et al. 2024 §2.1; the multi-head layout of DiffCLIP, Hammoud & Ghanem
  2025 §3.1) and folded back; a residual connection keeps the block a drop-in for the ``C2PSA`` it replaces.
- :class:`DiffPSAAttention`: the differential form of Ultralytics' ``Attention`` (the attention of the PSA blocks in
  ``C2PSA`` and ``C3k2(attn=True)``), with the same 1×1-conv QKV layout, the same 3×3 depthwise positional conv and
  the same parameters plus the λ vectors and the sub-norm weight.
- :class:`DiffC2PSA`, :class:`DiffC3k2`: ``C2PSA`` / ``C3k2`` whose attention is :class:`DiffPSAAttention`.

The equation of :class:`DiffPSAAttention` (Ye et al. 2024 eq. 1–3 on Ultralytics' layout): the 1×1 conv ``qkv``
gives, per standard head j of h, q_j, k_j of width d_k (``key_dim``) and v_j of width d_v (``head_dim``) at every
position; differential head i of H = h/2 pairs standard heads 2i and 2i + 1 (the "adjacent" layout of DiffCLIP):

    A1 = softmax(q_{2i}ᵀ k_{2i} · s),  A2 = softmax(q_{2i+1}ᵀ k_{2i+1} · s),  s = 1/√d_k
    V_i = [v_{2i}; v_{2i+1}]  (width 2·d_v)
    O_i = (1 − λ_init) · RMSNorm((A1 − λ A2) V_i),   λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init
    out = proj(concat_i O_i + pe(V))

with λ_q1, λ_k1, λ_q2, λ_k2 ∈ R^{d_k} drawn from N(0, 0.1²) and kept in float32, ``pe`` the depthwise 3×3 conv on
the values and ``proj`` the output 1×1 conv, exactly as in Ultralytics' ``Attention``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from ultralytics.nn.modules.block import C2PSA, Attention, C3k2
from ultralytics.nn.modules.conv import Conv

from ..lambdas import DEFAULT_LAMBDA_INIT, reparam_lambda, resolve_lambda_init
from ..layers import DiffAttention
from ..layers.norm import head_rms_norm
from ..ops import diff_attention

__all__ = ["DiffAttention2d", "DiffPSAAttention", "DiffC2PSA", "DiffC3k2", "make_psa_differential"]


def _check_map(x: torch.Tensor, channels: int, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[1] != channels:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a feature map of shape (B, C={channels}, H, W), got {got}")


class DiffAttention2d(nn.Module):
    """Differential attention over the flattened feature map: the DiffAttention block of the YOLO26 integration.

        X' = cv(X)                          (a 1×1 conv when c1 ≠ c2, else the identity)
        T  = flatten(X') ∈ R^{B×N×C},  N = H·W
        Y  = X' + fold(DiffAttention(T))    (``residual=False`` gives fold(DiffAttention(T)) alone)

    ``DiffAttention`` is :class:`diffattn.layers.DiffAttention` (Ye et al. 2024 §2.1, DiffCLIP's multi-head layout:
    ``num_heads`` standard heads of width C/num_heads, num_heads/2 differential heads, λ re-parameterised, per-head
    RMSNorm × (1 − λ_init)). It has no positional encoding: the convolutions around it carry position.

    Args (Ultralytics' YAML order after the channels): c1 input channels, c2 output channels, ``num_heads``
    (even, divides c2), ``lambda_init`` (a float, or ``"ye"`` with ``depth`` the 0-based layer index),
    ``residual``.
    """

    def __init__(self, c1: int, c2: int, num_heads: int = 8, lambda_init: float | str = DEFAULT_LAMBDA_INIT,
                 residual: bool = True, depth: int = 0):
        super().__init__()
        if not isinstance(residual, bool):
            raise ValueError(f"residual must be a bool, got {residual!r}")
        self.c1, self.c2 = int(c1), int(c2)
        self.cv = Conv(c1, c2, 1) if c1 != c2 else nn.Identity()
        self.attn = DiffAttention(c2, num_heads, depth=depth, lambda_init=lambda_init)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, c1, H, W) → (B, c2, H, W)."""
        _check_map(x, self.c1)
        x = self.cv(x)  # (B, C, H, W)
        B, C, H, W = x.shape
        t = x.flatten(2).transpose(1, 2)  # (B, N, C)
        y = self.attn(t).transpose(1, 2).reshape(B, C, H, W)
        return x + y if self.residual else y

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor) -> torch.Tensor:
        """The combined maps A1 − λ A2 of every differential head for input ``x`` (B, c1, H, W):
        (B, num_heads/2, N, N) with N = H·W, in row-major token order."""
        _check_map(x, self.c1)
        t = self.cv(x).flatten(2).transpose(1, 2)  # (B, N, C)
        _, w = self.attn(t, need_weights=True)
        return w.combined


class DiffPSAAttention(nn.Module):
    """The differential form of Ultralytics' ``Attention`` (module docstring for the equation).

    Same constructor and the same ``qkv``, ``proj``, ``pe`` convolutions as ``ultralytics.nn.modules.block.
    Attention``, so its state dict is Ultralytics' plus ``lambda_q1``, ``lambda_k1``, ``lambda_q2``, ``lambda_k2``
    and ``diff_norm.weight``. ``num_heads`` is the standard head count and must be even.

    Args:
        dim: channels C (= num_heads · head_dim).
        num_heads: h, standard heads; h/2 differential heads.
        attn_ratio: key width d_k = int(head_dim · attn_ratio), as in Ultralytics.
        lambda_init: λ_init, a float (DiffCLIP: 0.8) or ``"ye"``: 0.8 − 0.6·exp(−0.3·depth), ``depth`` 0-based.
    """

    def __init__(self, dim: int, num_heads: int = 8, attn_ratio: float = 0.5,
                 lambda_init: float | str = DEFAULT_LAMBDA_INIT, depth: int = 0):
        super().__init__()
        for name, v in (("dim", dim), ("num_heads", num_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if num_heads % 2 or dim % num_heads:
            raise ValueError(f"num_heads must be even and divide dim (num_heads/2 differential heads), got "
                             f"num_heads={num_heads}, dim={dim}")
        self.num_heads = num_heads
        self.diff_heads = num_heads // 2
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        if self.key_dim < 1:
            raise ValueError(f"attn_ratio must give a key width ≥ 1 (head_dim={self.head_dim}), got {attn_ratio!r}")
        self.scale = self.key_dim**-0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, 1, g=dim, act=False)
        self.lambda_init = resolve_lambda_init(lambda_init, depth)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.empty(self.key_dim, dtype=torch.float32).normal_(0.0, 0.1)) for _ in range(4))
        self.diff_norm = head_rms_norm(2 * self.head_dim)

    def lambda_value(self) -> torch.Tensor:
        """λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init (Ye et al. 2024 eq. 2), a 0-d tensor (float32, or float64
        when the λ vectors are)."""
        return reparam_lambda(self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2, self.lambda_init)

    def _heads(self, x: torch.Tensor):
        B, C, H, W = x.shape
        q, k, v = self.qkv(x).view(B, self.num_heads, 2 * self.key_dim + self.head_dim, H * W).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2)  # (B, h, d_k | d_k | d_v, N)
        q, k, v = q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1)  # (B, h, N, ·)
        return q, k, v

    def _values(self, v: torch.Tensor) -> torch.Tensor:
        """(B, h, N, d_v) → (B, H, N, 2·d_v): V_i = [v_{2i}; v_{2i+1}] along the channels."""
        B, _, N, dv = v.shape
        return v.view(B, self.diff_heads, 2, N, dv).permute(0, 1, 3, 2, 4).reshape(B, self.diff_heads, N, 2 * dv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, C, H, W) → (B, C, H, W)."""
        _check_map(x, self.num_heads * self.head_dim)
        B, C, H, W = x.shape
        q, k, v = self._heads(x)
        lam = self.lambda_value()
        o = diff_attention(q[:, 0::2], k[:, 0::2], q[:, 1::2], k[:, 1::2], self._values(v), lam,
                           scale=self.scale)  # (B, H, N, 2·d_v)
        o = self.diff_norm(o) * (1.0 - self.lambda_init)
        o = o.transpose(-2, -1).reshape(B, C, H, W)  # channel (2i + b)·d_v + e = head 2i + b, as Ultralytics
        v_map = v.transpose(-2, -1).reshape(B, C, H, W)
        return self.proj(o + self.pe(v_map))

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor):
        """A1, A2 and the combined map A1 − λ A2 of every differential head for input ``x`` (B, C, H, W), each
        (B, num_heads/2, N, N), N = H·W in row-major order (what :func:`diffattn.diagnostics.capture_attention`
        records for this module)."""
        _check_map(x, self.num_heads * self.head_dim)
        q, k, v = self._heads(x)
        _, w = diff_attention(q[:, 0::2], k[:, 0::2], q[:, 1::2], k[:, 1::2], self._values(v),
                              self.lambda_value().to(q.dtype), scale=self.scale, return_weights=True)
        return w

    def attention_maps(self, x: torch.Tensor) -> torch.Tensor:
        """The combined maps A1 − λ A2, (B, num_heads/2, N, N), N = H·W in row-major order."""
        return self.attention_weights(x).combined

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_dim={self.head_dim}, key_dim={self.key_dim}, "
                f"lambda_init={self.lambda_init:.4g}")


def make_psa_differential(module: nn.Module, lambda_init: float | str = DEFAULT_LAMBDA_INIT) -> int:
    """Replace every Ultralytics ``Attention`` inside ``module`` by a freshly initialised :class:`DiffPSAAttention`
    of the same sizes (``lambda_init="ye"`` numbers them 0, 1, … in module order); returns how many."""
    found = [(n, m) for n, m in module.named_modules() if type(m) is Attention]
    for depth, (name, m) in enumerate(found):
        owner, _, attr = name.rpartition(".")
        parent = module.get_submodule(owner) if owner else module
        attn_ratio = m.key_dim / m.head_dim
        new = DiffPSAAttention(m.num_heads * m.head_dim, m.num_heads, attn_ratio, lambda_init=lambda_init,
                               depth=depth)
        setattr(parent, attr, new.to(next(m.parameters()).device))
    return len(found)


class DiffC2PSA(C2PSA):
    """Ultralytics ``C2PSA`` whose PSA blocks use :class:`DiffPSAAttention` (same arguments as ``C2PSA``)."""

    def __init__(self, c1: int, c2: int, n: int = 1, e: float = 0.5):
        super().__init__(c1, c2, n, e)
        make_psa_differential(self)


class DiffC3k2(C3k2):
    """Ultralytics ``C3k2`` whose attention blocks (``attn=True``) use :class:`DiffPSAAttention` (same arguments as
    ``C3k2``; without ``attn`` it is a plain ``C3k2``)."""

    def __init__(self, c1: int, c2: int, n: int = 1, c3k: bool = False, e: float = 0.5, attn: bool = False,
                 g: int = 1, shortcut: bool = True):
        super().__init__(c1, c2, n, c3k, e, attn, g, shortcut)
        make_psa_differential(self)
