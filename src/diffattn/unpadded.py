"""Differential attention for a few query rows (decoding), without zero-padding: each cached key and value read once.

    O = (w1 ⊙ A1 − λ ⊙ A2) V,   A_b = softmax(Q_b K_bᵀ · s + M)        (Ye et al. 2024, eq. 1)

The ``sdpa`` backend of :func:`diffattn.functional.diff_attention` zero-pads Q and K to V's width 2d so that each
branch is one fused call; at decode time (Nq = 1 new token against Nk cached keys) that copies the whole key cache
into a padded buffer at every step and reads V twice. Here the Nq × Nk maps are small, so they are built: the two
(B, H, Nq, Nk) softmax maps are combined first and multiplied by V once,

    O = (w1 ⊙ softmax(Q1 K1ᵀ s + M) − λ ⊙ softmax(Q2 K2ᵀ s + M)) V,

which reads K1, K2 and V once each, at width d, d and dv: the bytes a standard layer of the same size reads. With
grouped-query attention the G = H / Hkv query heads of a key/value head are stacked into one matmul, so keys and
values are never repeated; when both branches share one K (Diff Transformer V2, Ye et al. 2026) the two queries are
stacked too and K is read once. The work is O(Nq · Nk) per head, so :func:`diffattn.functional.diff_attention`
chooses this path (``backend="auto"``) for at most :data:`DECODE_MAX_QUERIES` query rows on the CPU, where it was
measured faster (docs/benchmarks.md, decode).

For many query rows (prefill, evaluation) without a gradient, :func:`flex_diff_attention` runs each branch through
PyTorch's FlexAttention, which takes a value width 2d different from the query/key width d: no padding, but V is
read once per branch. It is opt-in: ``auto`` keeps the zero-padded ``sdpa`` path for prefill, because the compiled
FlexAttention was not faster on the CPU where it was measured (docs/benchmarks.md) and costs a compilation per shape.
"""

from __future__ import annotations

import torch

from .functional import Weight, prepare_mask

__all__ = ["DECODE_MAX_QUERIES", "decode_diff_attention", "flex_diff_attention"]

#: ``backend="auto"`` takes :func:`decode_diff_attention` for at most this many query rows (CPU)
DECODE_MAX_QUERIES = 16


def _grouped_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Q Kᵀ · s for q (B, H, Nq, d) and k (B, Hkv, Nk, d), H = G·Hkv, without repeating K: (B, H, Nq, Nk) in at
    least float32. Query head h reads key head h // G (the layout of ``repeat_interleave``)."""
    B, H, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = H // hkv
    s = torch.matmul(q.reshape(B, hkv, g * nq, d), k.transpose(-2, -1))  # (B, Hkv, G·Nq, Nk)
    return s.view(B, H, nq, nk).to(torch.promote_types(s.dtype, torch.float32)) * scale


def decode_diff_attention(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
                          lambda_: Weight, *, weight1: Weight = 1.0, attn_mask: torch.Tensor | None = None,
                          is_causal: bool = False, scale: float) -> torch.Tensor:
    """(w1 ⊙ A1 − λ ⊙ A2) V with the maps of the Nq query rows built and combined before one product by V.

    Shapes as :func:`diffattn.functional.diff_attention` (which validates the arguments and calls this function):
    q1, q2 (B, H, Nq, d); k1, k2 (B, Hkv, Nk, d); v (B, Hkv, Nk, dv); λ and w1 floats or tensors broadcastable
    to (B, H, Nq, 1); ``attn_mask`` bool (True = attend) or additive float; ``is_causal`` aligned to the end.
    Scores and softmax run in at least float32 (float64 stays float64); a row whose every key is masked gives 0.
    Returns (B, H, Nq, dv) in v's dtype.
    """
    B, H, nq, _ = q1.shape
    hkv, nk, dv = k1.shape[1], k1.shape[2], v.shape[-1]
    # one query row at the end of a causal sequence sees every key: no mask to build
    mask = prepare_mask(attn_mask, is_causal=is_causal and nq > 1, nq=nq, nk=nk,
                        dtype=torch.promote_types(q1.dtype, torch.float32), device=q1.device, scale=0.0)
    if k1 is k2:  # one K for both branches (Diff Transformer V2): stack the queries, read K once
        s = _grouped_scores(torch.cat([q1, q2], dim=2), k1, scale)  # (B, H, 2·Nq, Nk)
        s1, s2 = s[:, :, :nq], s[:, :, nq:]
    else:
        s1, s2 = _grouped_scores(q1, k1, scale), _grouped_scores(q2, k2, scale)  # each (B, H, Nq, Nk)
    p1 = torch.softmax(mask.apply(s1), dim=-1)
    p2 = torch.softmax(mask.apply(s2), dim=-1)
    cd = p1.dtype
    w1 = weight1.to(cd) if isinstance(weight1, torch.Tensor) else weight1
    lam = lambda_.to(cd) if isinstance(lambda_, torch.Tensor) else lambda_
    a = (p1 if isinstance(w1, float) and w1 == 1.0 else w1 * p1) - lam * p2  # (B, H, Nq, Nk)
    if mask.row_ok is not None:
        a = a * mask.row_ok
    a = a.to(v.dtype).reshape(B, hkv, (H // hkv) * nq, nk)  # (B, Hkv, G·Nq, Nk)
    return torch.matmul(a, v).view(B, H, nq, dv)  # V read once


_COMPILED_FLEX = None


def _flex(compiled: bool):
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention)
    return _COMPILED_FLEX


def flex_diff_attention(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
                        lambda_: Weight, *, weight1: Weight = 1.0, attn_mask: torch.Tensor | None = None,
                        is_causal: bool = False, scale: float, compiled: bool = True) -> torch.Tensor:
    """(w1 ⊙ A1 − λ ⊙ A2) V = w1 ⊙ (A1 V) − λ ⊙ (A2 V) with one FlexAttention call per branch, Q and K at their own
    width d and V at dv: no zero-padding. Forward only (FlexAttention has no CPU backward).

    Arguments as :func:`decode_diff_attention` (shapes as :func:`diffattn.functional.diff_attention`); the causal
    mask alone becomes a block mask (the blocks above the diagonal are skipped), any other mask a score
    modification. ``compiled=False`` runs FlexAttention's eager reference (exact, for tests). A row whose every key
    is masked gives 0. Returns (B, H, Nq, dv) in v's dtype.
    """
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q1, k1, q2, k2, v)):
        raise ValueError("flex_diff_attention computes no gradient (FlexAttention has no CPU backward); call it under "
                         "torch.no_grad() or use diffattn.functional.diff_attention")
    from torch.nn.attention.flex_attention import create_block_mask

    B, H, nq, _ = q1.shape
    hkv, nk = k1.shape[1], k1.shape[2]
    flex = _flex(compiled)
    kw: dict = {"scale": scale, "enable_gqa": H != hkv}
    row_ok = None
    if attn_mask is None and is_causal:
        offset = nk - nq

        def causal(b, h, qi, ki):  # query i sees keys j ≤ i + Nk − Nq
            return ki <= qi + offset

        kw["block_mask"] = create_block_mask(causal, None, None, nq, nk, device=q1.device)
    elif attn_mask is not None or is_causal:
        mask = prepare_mask(attn_mask, is_causal=is_causal, nq=nq, nk=nk, dtype=q1.dtype, device=q1.device,
                            scale=0.0)
        keep, bias, row_ok = mask.keep, mask.bias, mask.row_ok  # (1|B, 1|H, Nq, Nk)
        kb, kh = keep.shape[0] > 1, keep.shape[1] > 1
        bb, bh = (bias.shape[0] > 1, bias.shape[1] > 1) if bias is not None else (False, False)

        def score_mod(score, b, h, qi, ki):
            if bias is not None:
                score = score + bias[b if bb else 0, h if bh else 0, qi, ki]
            return torch.where(keep[b if kb else 0, h if kh else 0, qi, ki], score, -float("inf"))

        kw["score_mod"] = score_mod
    o1 = flex(q1, k1, v, **kw)  # (B, H, Nq, dv)
    o2 = flex(q2, k2, v, **kw)
    out = (o1 if isinstance(weight1, float) and weight1 == 1.0 else o1 * weight1) - o2 * lambda_
    if row_ok is not None:
        out = out.masked_fill(~row_ok, 0.0)
    return out.to(v.dtype)
