"""Differential attention without zero-padding for inference with many query rows (prefill, evaluation), through
PyTorch's FlexAttention.

    O = (w1 ⊙ A1 − λ ⊙ A2) V = w1 ⊙ (A1 V) − λ ⊙ (A2 V),   A_b = softmax(Q_b K_bᵀ · s + M)     (Ye et al. 2024, eq. 1)

The ``sdpa`` backend of :func:`diffattn.functional.diff_attention` zero-pads Q and K to V's width 2d so that each
branch is one fused call (PyTorch's CPU flash kernel needs equal widths). FlexAttention accepts a value width 2d
different from the query/key width d, so :func:`flex_diff_attention` runs each branch unpadded; it has no CPU
backward, so it serves inference only. It is opt-in: ``auto`` keeps the padded ``sdpa`` path for prefill, because the
compiled FlexAttention was not faster on the CPU where it was measured (``benchmarks/decode.py --flex``) and costs a
compilation per shape. Decoding (a few query rows) needs neither: ``auto`` runs
:func:`diffattn.functional.decode_diff_attention` there.
"""

from __future__ import annotations

import torch

from .functional import Weight, prepare_mask

__all__ = ["flex_diff_attention"]

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
