"""How a paged-attention server computes every attention kind of diffattn with one standard attention call per
layer, and the reference models it reads the layout from. Plain PyTorch, no vLLM: the main test suite checks the
arithmetic here against the layers themselves.

**One call, one cache.** A differential layer (Ye et al. 2024, eq. 1; grouped differential attention, Motif
Technologies 2025, arXiv 2510.06949) has signal queries Q1 (H_s heads of width d), noise queries Q2 (H_n heads), and
per key/value group m a signal key K1_m, a noise key K2_m (width d each) and one value V_m of width 2d. A server stores
one key and one value per token, layer and key/value head. Here key head m is [K1_m ‖ K2_m] (width 2d) and value head
m is V_m (width 2d), exactly the bytes of the layer's own K and V, and the queries are zero-padded:

    signal query i → [Q1_i ‖ 0],   noise query j → [0 ‖ Q2_j]       (width 2d, scale 1/√d, not 1/√(2d))
    [Q1_i ‖ 0]·[K1_m ‖ K2_m] = Q1_i·K1_m,   [0 ‖ Q2_j]·[K1_m ‖ K2_m] = Q2_j·K2_m

so one grouped-query attention call with H_s + H_n query heads over H_kv/2 key/value heads of width 2d returns
A1_i V_m for every signal head and A2_j V_m for every noise head, each noise map computed once (the FLOP saving of
grouped differential attention). The queries are ordered group by group (:meth:`ServedLayer.query_order`: the signal
heads of key/value group m, then its noise heads), which is the grouped-query layout every paged-attention backend
takes, and which shards by key/value group under tensor parallelism. Then

    O_i = w1 ⊙ A1_i V_m − λ ⊙ A2_{i // r} V_m,   out = (1 − λ_init) · RMSNorm(O_i)   (the layer's own sub-norm)

The alternatives cost more cache: two attention layers (K1 with V, K2 with V) store V twice, 1.5× the bytes per
token; splitting V into two d-wide heads and calling attention for each branch and half stores K twice and makes
four calls. The padding doubles the width of the Q·K products, not the cache.

Diff Transformer V2 (Ye et al. 2026) needs no padding: its 2h query heads share h_kv key/value heads of width d in the
grouped-query layout, O_i = A_{2i} V − λ_i A_{2i+1} V. Standard attention is one call as usual.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import Attention, DiffAttention, DiffAttentionV2, GatedDiffAttention, GroupedDiffAttention
from ..layers.rope import apply_rotary
from ..layers.spec import attention_class, attention_kind

__all__ = ["ServedLayer", "served_attention", "static_lambda", "PAIRED_KINDS", "SERVED_KINDS"]

#: the layer classes whose forward a server computes through :func:`served_attention`, each by its head layout
#: (:mod:`diffattn.layers.spec`): "single" one map per head, "paired" one signal and one noise key per key/value
#: group and a value of width 2d, "branched" two query heads per output head over shared keys and values
SERVED_CLASSES = (Attention, DiffAttention, GatedDiffAttention, DiffAttentionV2, GroupedDiffAttention)
#: every attention kind a server computes
SERVED_KINDS = tuple(c.kind for c in SERVED_CLASSES)
#: the served kinds of the paired head layout
PAIRED_KINDS = tuple(c.kind for c in SERVED_CLASSES if c.head_layout == "paired")


@dataclass(frozen=True)
class ServedLayer:
    """The served shape of one diffattn attention layer (read from the layer with :meth:`of`).

    ``num_heads`` query heads of width ``head_dim`` in ``q_proj`` (the checkpoint's order), ``num_kv_heads`` key heads
    of width ``head_dim`` in ``k_proj`` and as many in ``v_proj``; ``num_noise_heads`` H_n for the paired kinds
    (H_s = num_heads − H_n signal heads; 0 for the others)."""

    kind: str
    head_layout: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_noise_heads: int = 0

    @classmethod
    def of(cls, layer: nn.Module) -> ServedLayer:
        """The served shape of ``layer``, an attention layer of the library (on any device, ``meta`` included)."""
        kind = attention_kind(layer)
        if kind is None or attention_class(kind) not in SERVED_CLASSES:
            raise ValueError(f"attention kind {kind!r} ({type(layer).__name__}) cannot be served; the served kinds "
                             f"are {SERVED_KINDS}")
        layout = attention_class(kind).head_layout
        noise = layer.num_noise_heads if layout == "paired" else 0
        return cls(kind, layout, layer.q_heads, layer.num_kv_heads, layer.head_dim, noise)

    # ------------------------------------------------------------------------------------------- shapes

    @property
    def paired(self) -> bool:
        return self.head_layout == "paired"

    @property
    def groups(self) -> int:
        """Key/value heads of the attention call: H_kv/2 of width 2d for the paired kinds, else H_kv of width d."""
        return self.num_kv_heads // 2 if self.paired else self.num_kv_heads

    @property
    def head_size(self) -> int:
        """Width of a query, key and value head in the attention call."""
        return 2 * self.head_dim if self.paired else self.head_dim

    @property
    def signal_heads(self) -> int:
        """Heads of the layer's output (the input of ``out_proj``, each of width :attr:`out_head_size`)."""
        if self.paired:
            return self.num_heads - self.num_noise_heads
        return self.num_heads // 2 if self.head_layout == "branched" else self.num_heads

    @property
    def out_head_size(self) -> int:
        return 2 * self.head_dim if self.paired else self.head_dim

    @property
    def ratio(self) -> int:
        """r = H_s / H_n, signal heads per noise head (1 for differential attention)."""
        return self.signal_heads // self.num_noise_heads if self.paired else 1

    @property
    def lambda_heads(self) -> int:
        """The heads a per-head λ has: one per noise head (paired kinds), one per differential head (V2)."""
        return self.num_noise_heads if self.paired else self.signal_heads

    def check_parallel(self, tp: int) -> None:
        """ValueError unless ``tp`` ranks can each take whole key/value groups (tensor parallelism shards heads)."""
        if self.groups % tp:
            what = "key/value groups (num_kv_heads / 2)" if self.paired else "key/value heads"
            raise ValueError(f"tensor_parallel_size={tp} must divide the {what} of a {self.kind!r} layer, "
                             f"{self.groups}")

    def query_order(self) -> list[int]:
        """For each served query head, the index of the checkpoint's query head it is (group-major order: the signal
        heads of key/value group m, then its noise heads). The checkpoint orders the paired kinds' query heads in
        groups of r + 1, [signal × r, noise] per noise head; V2 and standard attention keep their order."""
        if not self.paired:
            return list(range(self.num_heads))
        r, g = self.ratio, self.groups
        s, n = self.signal_heads // g, self.num_noise_heads // g
        order = []
        for m in range(g):
            order += [(i // r) * (r + 1) + i % r for i in range(m * s, (m + 1) * s)]
            order += [j * (r + 1) + r for j in range(m * n, (m + 1) * n)]
        return order


def static_lambda(lambda_fn: nn.Module) -> tuple | None:
    """(weight1, λ) of a λ form that does not read the input (``reparam``, ``dual_scalar``, ``constant``, ``annealed``
    at inference), with 0-d tensors as Python floats, computed once after the weights are loaded; None for a form
    that reads the tokens (``gate``, ``token_sigmoid``), which is computed at every forward."""
    try:
        with torch.no_grad():
            w1, lam = lambda_fn(None)
    except (TypeError, AttributeError):
        return None
    return tuple(float(w) if isinstance(w, torch.Tensor) and w.dim() == 0 else w for w in (w1, lam))


def _per_head(w, heads: int, tokens: int, local: int | None = None) -> float | torch.Tensor:
    """A λ form's weight (a float, a 0-d tensor, or a tensor broadcastable to (1, H, N, 1), H every head's or this
    rank's ``local`` heads) → a float or a tensor broadcastable to (N, H)."""
    if not isinstance(w, torch.Tensor) or w.dim() == 0:
        return w
    if w.dim() != 4 or w.shape[0] != 1 or w.shape[1] not in (1, heads, local) or w.shape[2] not in (1, tokens):
        raise ValueError(f"a λ form returned a weight of shape {tuple(w.shape)}; a server takes a scalar or "
                         f"(1, {heads} or 1, {tokens} or 1, 1)")
    return w[0, :, :, 0].transpose(0, 1)  # (N or 1, H or 1)


def served_attention(layer: ServedLayer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend, *,
                     weight1=1.0, lam=0.0, rank: int = 0, tp: int = 1) -> torch.Tensor:
    """The attention heads of one layer for ``T`` tokens in one call of ``attend`` (module docstring), before the
    sub-norm and ``out_proj``.

    q: (T, Hq·d) served query heads of this rank (after the rotary embedding, in :meth:`ServedLayer.query_order`);
    k, v: (T, Hkv·d) this rank's key and value heads; ``attend(q, k, v)`` is standard grouped-query attention over
    :attr:`ServedLayer.groups`/tp heads of width :attr:`ServedLayer.head_size` with scale 1/√d (a server's paged
    attention), returning (T, heads·head_size). ``weight1`` and ``lam`` are the layer's λ form output for these
    tokens (a float or (1, H_λ, T or 1, 1) over all :attr:`ServedLayer.lambda_heads` heads, of which this rank takes
    its own, or over this rank's heads alone).
    Returns (T, H_out·w): H_out = signal heads / tp of width :attr:`ServedLayer.out_head_size`.
    """
    T, d = q.shape[0], layer.head_dim
    if layer.head_layout == "single":
        return attend(q, k, v)
    lam_heads = layer.lambda_heads // tp
    w1 = _local(_per_head(weight1, layer.lambda_heads, T, lam_heads), rank, lam_heads)
    lm = _local(_per_head(lam, layer.lambda_heads, T, lam_heads), rank, lam_heads)
    if layer.head_layout == "branched":
        o = attend(q, k, v).view(T, -1, 2, d)  # (T, h, 2, d): branches 2i and 2i + 1
        return _combine(w1, o[:, :, 0], lm, o[:, :, 1]).reshape(T, -1)
    g = layer.groups // tp
    s, n = layer.signal_heads // layer.groups, layer.num_noise_heads // layer.groups
    qg = q.view(T, g, s + n, d)
    padded = q.new_zeros(T, g, s + n, 2 * d)
    padded[:, :, :s, :d] = qg[:, :, :s]  # [Q1 ‖ 0]
    padded[:, :, s:, d:] = qg[:, :, s:]  # [0 ‖ Q2]
    o = attend(padded.view(T, -1), k, v).view(T, g, s + n, 2 * d)
    signal = o[:, :, :s]  # (T, g, s, 2d): A1 V
    noise = o[:, :, s:].repeat_interleave(layer.ratio, dim=2) if layer.ratio > 1 else o[:, :, s:]  # A2 V per signal
    r = layer.ratio
    if isinstance(w1, float) and w1 == 1.0 and isinstance(lm, float):  # one λ per layer: one op
        return torch.sub(signal, noise, alpha=lm).reshape(T, -1)
    return _combine(_groups(w1, g, s, r), signal, _groups(lm, g, s, r), noise).reshape(T, -1)


def _combine(w1, signal: torch.Tensor, lam, noise: torch.Tensor) -> torch.Tensor:
    """w1 ⊙ signal − λ ⊙ noise, with one fused multiply-subtract for a tensor λ."""
    if isinstance(lam, (int, float)):
        return _times(w1, signal) - _times(lam, noise)
    if lam.dim() > 0 and lam.dim() < noise.dim():
        lam = lam.unsqueeze(-1)
    return torch.addcmul(_times(w1, signal), lam.to(noise.dtype), noise, value=-1)


def _local(w, rank: int, heads: int):
    """This rank's heads of a (N, H) weight (a float, a (N, 1) weight or one of ``heads`` heads, already this
    rank's, is returned as it is)."""
    if not isinstance(w, torch.Tensor) or w.dim() == 0 or w.shape[1] in (1, heads):
        return w
    return w[:, rank * heads:(rank + 1) * heads]


def _groups(w, g: int, s: int, r: int):
    """A (N, H_n) weight per noise head → (N, g, s, 1) per signal head (signal head i has noise head i // r)."""
    if not isinstance(w, torch.Tensor) or w.dim() == 0:
        return w
    if w.shape[1] > 1 and r > 1:
        w = w.repeat_interleave(r, dim=1)
    return w.reshape(w.shape[0], g if w.shape[1] > 1 else 1, s if w.shape[1] > 1 else 1, 1)


def _times(w, o: torch.Tensor) -> torch.Tensor:
    """w ⊙ o for a weight w (a float, a 0-d tensor, or one that broadcasts against o but for o's last dim)."""
    if isinstance(w, (int, float)):
        return o if w == 1.0 else o * w
    if w.dim() > 0 and w.dim() < o.dim():
        w = w.unsqueeze(-1)
    return o * w.to(o.dtype)


def sub_norm(out: torch.Tensor, width: int, weight: torch.Tensor | None, eps: float, scale: float) -> torch.Tensor:
    """The per-head RMSNorm × (1 − λ_init) of a differential layer (Ye et al. 2024 §2.1) on (T, heads·width)."""
    T = out.shape[0]
    w = weight.to(out.dtype) * scale if weight is not None else (
        torch.full((width,), scale, dtype=out.dtype, device=out.device) if scale != 1.0 else None)
    return F.rms_norm(out.view(T, -1, width), (width,), w, eps).reshape(T, -1)


def sdpa_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, heads: int, kv_heads: int, head_size: int,
                scale: float) -> torch.Tensor:
    """Causal grouped-query attention of one sequence, (T, heads·w) → (T, heads·w): what a server's paged attention
    computes for a prompt, through PyTorch's SDPA (the reference of the tests)."""
    T = q.shape[0]
    qh = q.view(T, heads, head_size).transpose(0, 1)  # (H, T, w)
    kh = k.view(T, kv_heads, head_size).transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
    vh = v.view(T, kv_heads, head_size).transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
    o = F.scaled_dot_product_attention(qh[None], kh[None], vh[None], is_causal=True, scale=scale)[0]
    return o.transpose(0, 1).reshape(T, -1)


def reference_layer_forward(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A diffattn attention layer's causal forward on one sequence x (T, dim) computed the served way: the query
    heads permuted into :meth:`ServedLayer.query_order`, one call of :func:`sdpa_attend` through
    :func:`served_attention`, the sub-norm and ``out_proj``. Equal to ``attn(x[None], is_causal=True)[0]`` up to
    rounding; what the tests check the served arithmetic with."""
    layout = ServedLayer.of(attn)
    T, d = x.shape[0], layout.head_dim
    order = torch.tensor(layout.query_order())
    q_lin = attn.q_proj(x)
    q = q_lin.view(T, layout.num_heads, d)[:, order]
    k = attn.k_proj(x).view(T, layout.num_kv_heads, d)
    if attn.rotary is not None:
        cos, sin = attn.rotary(torch.arange(T), dtype=q.dtype)
        q = apply_rotary(q.transpose(0, 1)[None], cos, sin, attn.rotary.style)[0].transpose(0, 1)
        k = apply_rotary(k.transpose(0, 1)[None], cos, sin, attn.rotary.style)[0].transpose(0, 1)
    v = attn.v_proj(x)

    def attend(qq, kk, vv):
        return sdpa_attend(qq, kk, vv, heads=layout.num_heads, kv_heads=layout.groups, head_size=layout.head_size,
                           scale=1.0 / math.sqrt(d))

    weight1, lam = (1.0, 0.0) if layout.head_layout == "single" else attn.lambda_fn(x[None])
    out = served_attention(layout, q.reshape(T, -1), k.reshape(T, -1), v, attend, weight1=weight1, lam=lam)
    norm = getattr(attn, "diff_norm", None)
    if isinstance(norm, nn.RMSNorm):
        out = sub_norm(out, layout.out_head_size, norm.weight, norm.eps, attn.out_scale)
    elif getattr(attn, "out_scale", 1.0) != 1.0:
        out = out * attn.out_scale
    out = attn.out_proj(out)
    if getattr(attn, "q_residual", False):
        out = out + q_lin
    return out


def copy_module(module: nn.Module, device: torch.device | str) -> nn.Module:
    """A copy of ``module`` (built on the ``meta`` device from a configuration) with uninitialised storage on
    ``device``: every parameter and buffer is then loaded from the checkpoint."""
    return copy.deepcopy(module).to_empty(device=device)
