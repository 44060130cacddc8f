"""The attention calls every retrofit method is made of, with the family's rule for fully masked query rows.

Each goes through :func:`diffattn.functional.attention` or :func:`diffattn.functional.diff_attention`, so masks,
grouped-query attention and the backends (SDPA, the fused Triton kernel on CUDA) have one implementation.
"""

from __future__ import annotations

import torch

from ...ops import AttentionWeights, functional

__all__ = ["MASKED_ROWS", "attend", "diff_attend", "split_channels"]

#: what a query row whose every key is masked gets: ``"zero"`` (the operator's rule: output 0, map 0) or
#: ``"uniform"`` (the softmax of equal ``finfo.min`` logits: every key weighted 1/Nk, the mean of V, as
#: transformers' eager attention computes it)
MASKED_ROWS = ("zero", "uniform")


def _dead_rows(attn_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(…, Nq) True where every key of the query row is blocked (the operator's rule: False in a bool mask, at or
    below ``finfo.min / 2`` in an additive one), or None when no row is."""
    if attn_mask is None or attn_mask.dim() == 0:
        return None
    blocked = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask <= torch.finfo(attn_mask.dtype).min / 2
    rows = blocked.all(dim=-1)
    return rows if bool(rows.any()) else None


def _uniform_rows(out: torch.Tensor, maps, v: torch.Tensor, rows: torch.Tensor, weight, diff: bool):
    """``out`` (B, h, Nq, dv) and the maps with the ``rows`` whose keys are all masked set to what a softmax over
    equal logits gives: each branch's map 1/Nk, the output ``weight`` · mean over keys of V (weight 1, or 1 − λ for
    A1 − λ A2)."""
    h, nk = out.shape[1], v.shape[-2]
    fill = v.mean(dim=-2, keepdim=True).repeat_interleave(h // v.shape[1], dim=1) * weight  # (B, h, 1, dv)
    dead = rows.unsqueeze(-1)  # (…, Nq, 1)
    out = torch.where(dead, fill.to(out.dtype), out)
    if maps is None:
        return out, None

    def fix(m, value):
        return None if m is None else torch.where(dead, torch.as_tensor(value, dtype=m.dtype, device=m.device), m)

    if diff:
        return out, AttentionWeights(fix(maps.first, 1.0 / nk), fix(maps.second, 1.0 / nk),
                                     fix(maps.combined, weight / nk))
    return out, fix(maps, 1.0 / nk)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weights: bool, masked_rows: str = "zero",
           **kw) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(Q Kᵀ s + M) V through :func:`diffattn.functional.attention`, with the map when ``weights``; fully
    masked query rows as ``masked_rows`` says (:data:`MASKED_ROWS`). q: (B, h, Nq, d), k/v: (B, Hkv, Nk, d)."""
    if weights:
        out, p = functional.attention(q, k, v, return_weights=True, **kw)
    else:
        out, p = functional.attention(q, k, v, **kw), None
    rows = _dead_rows(kw.get("attn_mask")) if masked_rows == "uniform" else None
    return (out, p) if rows is None else _uniform_rows(out, p, v, rows, 1.0, diff=False)


def diff_attend(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
                lam: torch.Tensor, weights: bool, masked_rows: str = "zero",
                **kw) -> tuple[torch.Tensor, AttentionWeights | None]:
    """(A1 − λ A2) V (Ye et al. 2024, eq. 1) through :func:`diffattn.functional.diff_attention`, with
    (A1, A2, A1 − λ A2) when ``weights``; fully masked query rows as ``masked_rows`` says (:data:`MASKED_ROWS`)."""
    if weights:
        out, ws = functional.diff_attention(q1, k1, q2, k2, v, lam, return_weights=True, **kw)
    else:
        out, ws = functional.diff_attention(q1, k1, q2, k2, v, lam, **kw), None
    rows = _dead_rows(kw.get("attn_mask")) if masked_rows == "uniform" else None
    if rows is None:
        return out, ws
    return _uniform_rows(out, ws, v, rows, (1.0 - torch.as_tensor(lam)).to(v.device, v.dtype), diff=True)


def split_channels(head_dim: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel indices of the two split-head groups: G1 = [0, d/4) ∪ [d/2, 3d/4), G2 = the rest (rotary pairs
    i, i + d/2 stay in one group)."""
    d, q4 = head_dim, head_dim // 4
    g1 = torch.cat([torch.arange(0, q4), torch.arange(2 * q4, 3 * q4)]).to(device)
    g2 = torch.cat([torch.arange(q4, 2 * q4), torch.arange(3 * q4, d)]).to(device)
    return g1, g2
