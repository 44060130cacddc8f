"""The decode attention of the operator (``functional.decode_diff_attention``): no zero-padding, exact against the
float64 reference, chosen by the ``auto`` backend on the CPU for a few query rows only."""

from __future__ import annotations

import pytest
import torch

from diffattn.functional import DECODE_MAX_QUERIES, decode_diff_attention, diff_attention
from diffattn.ops import functional

from .reference import F64, TOLERANCES, reference


def _inputs(B, H, hkv, nq, nk, d, dv, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=F64).to(dtype)

    return r(B, H, nq, d), r(B, hkv, nk, d), r(B, H, nq, d), r(B, hkv, nk, d), r(B, hkv, nk, dv)


@pytest.mark.parametrize("hkv", [4, 2, 1])
@pytest.mark.parametrize("nq", [1, 3])
@pytest.mark.parametrize("shared_k", [False, True])
def test_decode_matches_float64_reference(hkv, nq, shared_k):
    """GQA by grouping (no repeated K/V), a shared K (Diff Transformer V2), masks, causal, per-token λ and w1."""
    q1, k1, q2, k2, v = _inputs(2, 4, hkv, nq, 11, 8, 16)
    if shared_k:
        k2 = k1
    lam = torch.rand(2, 4, nq, 1, dtype=F64)
    w1 = torch.rand(2, 1, nq, 1, dtype=F64) + 0.5
    allowed = torch.rand(2, 1, nq, 11, generator=torch.Generator().manual_seed(1)) > 0.3
    allowed[:, :, :, 0] = True
    out = decode_diff_attention(q1, k1, q2, k2, v, lam, weight1=w1, attn_mask=allowed, is_causal=True, scale=0.3)
    ref = reference(q1, k1, q2, k2, v, lam, w1, allowed=allowed, causal=True, scale=0.3)
    assert out.shape == (2, 4, nq, 16)
    assert torch.allclose(out, ref, **TOLERANCES[F64])


def test_decode_float_mask_and_fully_masked_row_give_zero():
    q1, k1, q2, k2, v = _inputs(1, 2, 2, 2, 7, 4, 8)
    bias = torch.randn(1, 1, 2, 7, dtype=F64)
    bias[..., 1, :] = torch.finfo(F64).min  # row 1: every key blocked
    out = decode_diff_attention(q1, k1, q2, k2, v, 0.4, attn_mask=bias, scale=0.5)
    allowed = bias > torch.finfo(F64).min / 2
    ref = reference(q1, k1, q2, k2, v, 0.4, allowed=allowed, bias=bias.masked_fill(~allowed, 0.0), scale=0.5)
    assert torch.allclose(out, ref, **TOLERANCES[F64])
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_low_precision_within_tolerance(dtype):
    q1, k1, q2, k2, v = _inputs(2, 4, 2, 1, 64, 16, 32, dtype=dtype)
    out = decode_diff_attention(q1, k1, q2, k2, v, 0.7, is_causal=True, scale=0.25)
    assert out.dtype == dtype
    ref = reference(q1, k1, q2, k2, v, 0.7, causal=True, scale=0.25)
    assert torch.allclose(out.to(F64), ref, **TOLERANCES[dtype])


def test_auto_takes_decode_path_for_few_queries_only(monkeypatch):
    """``auto`` on the CPU runs the unpadded path for up to DECODE_MAX_QUERIES query rows against more keys, the sdpa
    backend above that and for a sequence attending to itself; both give the reference."""
    calls = []
    real = functional.decode_diff_attention
    monkeypatch.setattr(functional, "decode_diff_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    for nq, nk, expect in ((1, 40, 1), (DECODE_MAX_QUERIES, 40, 1), (DECODE_MAX_QUERIES + 1, 40, 0), (8, 8, 0)):
        calls.clear()
        q1, k1, q2, k2, v = _inputs(1, 4, 2, nq, nk, 8, 16)
        out = diff_attention(q1, k1, q2, k2, v, 0.5, is_causal=True)
        assert len(calls) == expect, (nq, nk)
        assert torch.allclose(out, reference(q1, k1, q2, k2, v, 0.5, causal=True), **TOLERANCES[F64])
    calls.clear()
    diff_attention(q1[:, :, :1], k1, q2[:, :, :1], k2, v, 0.5, backend="sdpa")  # an explicit backend is kept
    assert not calls
    assert functional._decode_preferred(1, 2) and not functional._decode_preferred(DECODE_MAX_QUERIES + 1, 99)
    assert not functional._decode_preferred(3, 3)  # a short sequence attending to itself keeps sdpa


def test_decode_has_gradients_like_math():
    q1, k1, q2, k2, v = (t.requires_grad_() for t in _inputs(1, 2, 1, 1, 5, 4, 8))
    assert torch.autograd.gradcheck(
        lambda *t: decode_diff_attention(*t, 0.3, scale=0.5), (q1, k1, q2, k2, v))
