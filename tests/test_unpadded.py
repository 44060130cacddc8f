"""Inference without zero-padding through FlexAttention (diffattn.ops.unpadded): exact against the float64 reference for
every mask kind, forward only."""

from __future__ import annotations

import pytest
import torch

from diffattn.ops.unpadded import flex_diff_attention

from .reference import F64, TOLERANCES, reference


def _inputs(B, H, hkv, nq, nk, d, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g, dtype=F64)
                 for s in ((B, H, nq, d), (B, hkv, nk, d), (B, H, nq, d), (B, hkv, nk, d), (B, hkv, nk, dv)))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("hkv", [4, 2])
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_flex_matches_float64_reference(hkv, mask):
    """FlexAttention (eager reference mode) per branch, no padding: the float64 reference for every mask kind, a
    fully masked row gives 0."""
    q1, k1, q2, k2, v = _inputs(2, 4, hkv, 6, 9, 8, 16)
    lam = torch.rand(2, 4, 6, 1, dtype=F64)
    allowed = bias = attn_mask = None
    if mask == "bool":
        allowed = torch.rand(2, 1, 6, 9, generator=torch.Generator().manual_seed(2)) > 0.4
        allowed[0, 0, 3] = False  # a fully masked row
        attn_mask = allowed
    elif mask == "float":
        attn_mask = torch.randn(1, 4, 6, 9, dtype=F64)
        attn_mask[..., 0] = torch.finfo(F64).min
        allowed = attn_mask > torch.finfo(F64).min / 2
        bias = attn_mask.masked_fill(~allowed, 0.0)
    causal = mask in ("causal", "bool")
    with torch.no_grad():
        out = flex_diff_attention(q1, k1, q2, k2, v, lam, weight1=0.9, attn_mask=attn_mask, is_causal=causal,
                                  scale=0.4, compiled=False)
    ref = reference(q1, k1, q2, k2, v, lam, 0.9, allowed=allowed, bias=bias, causal=causal, scale=0.4)
    assert torch.allclose(out, ref, **TOLERANCES[F64])
    if mask == "bool":
        assert torch.equal(out[0, :, 3], torch.zeros_like(out[0, :, 3]))


def test_flex_refuses_gradients():
    q1, k1, q2, k2, v = _inputs(1, 2, 2, 3, 3, 4, 8)
    with pytest.raises(ValueError, match="computes no gradient"):
        flex_diff_attention(q1.requires_grad_(), k1, q2, k2, v, 0.5, scale=0.5, compiled=False)
