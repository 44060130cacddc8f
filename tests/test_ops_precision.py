"""The precision contract of the differential subtraction (docs/reliability.md, "Precision"; measured by
``benchmarks/precision.py``).

For bfloat16 and float16 inputs on the CPU, every path of the operator forms both maps' outputs (or the maps) in
float32, subtracts in float32 and rounds once, so that with u the dtype's unit roundoff and u32 float32's

    max |O − O_ref| ≤ C · (u · max |O_ref| + √Nk · u32 · max |w1 ⊙ A1 V|),   C = 8

also when the two maps are alike and λ ≈ w1, where O is hundreds of times smaller than w1 ⊙ A1 V. The benchmark
measured at most 3.2 for the factor over five kinds, three dtypes, λ ∈ {0.2, 0.8, 1} and ε ∈ {1 … 0}; the two-call
recipe (two half-precision attention calls subtracted in half precision) measured 140 to 570 in the cancelling case,
which is what the second test checks, so that the first can fail. 8-bit float inputs are refused.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from diffattn.ops import attention, decode_diff_attention, diff_attention, diff_attention_pairs

B, H, N, D = 1, 2, 256, 64
C = 8.0
HALF = (torch.bfloat16, torch.float16)


def _u(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def _bound(dtype: torch.dtype, out: torch.Tensor, first: torch.Tensor) -> float:
    """u · max |O_ref| + √Nk · u32 · max |w1 ⊙ A1 V| (module docstring)."""
    return _u(dtype) * out.abs().max().item() + math.sqrt(N) * _u(torch.float32) * first.abs().max().item()


def _rows(w, rows: slice):
    """A weight's rows ``rows`` (a per-token weight), or the weight itself."""
    return w[:, :, rows] if isinstance(w, torch.Tensor) and w.dim() == 4 else w


def _cast(w, dtype: torch.dtype):
    return w.to(dtype) if isinstance(w, torch.Tensor) else w


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack((a, b), dim=2).flatten(1, 2)


def _case(kind: str, lam: float, eps: float, dtype: torch.dtype, seed: int = 0):
    """Rounded inputs and weights of one kind's operator call; q2 = q1 + ε·noise, k2 = k1 + ε·noise."""
    g = torch.Generator().manual_seed(seed)
    q1, k1 = torch.randn(B, H, N, D, generator=g), torch.randn(B, H, N, D, generator=g)
    q2 = q1 + eps * torch.randn(q1.shape, generator=g)
    if kind == "diff_v2":  # one K for both branches, values of width d, λ per token and head
        k2, v = k1, torch.randn(B, H, N, D, generator=g)
        w1, lam_t = 1.0, torch.full((B, H, N, 1), lam)
    else:
        k2, v = k1 + eps * torch.randn(k1.shape, generator=g), torch.randn(B, H, N, 2 * D, generator=g)
        if kind == "diff":  # the reparam λ: one 0-D float32 tensor
            w1, lam_t = 1.0, torch.tensor(lam)
        else:  # gated: w1 = g, λ = 1 − g, with λ / w1 = lam
            w1 = torch.full((B, H, N, 1), 1 / (1 + lam))
            lam_t = 1 - w1
    x = [t.to(dtype) for t in (q1, k1, q2, k2, v)]
    if kind == "diff_v2":
        x[3] = x[1]
    return x, w1, lam_t


def _call(kind, path, q1, k1, q2, k2, v, w1, lam):
    if path == "decode":  # the last 8 query rows, as auto takes it for a KV cache
        rows = slice(N - 8, N)
        return decode_diff_attention(q1[:, :, rows], k1, q2[:, :, rows], k2, v, _rows(lam, rows),
                                     weight1=_rows(w1, rows),
                                     scale=D ** -0.5)
    if kind == "diff_v2":
        return diff_attention_pairs(_interleave(q1, q2), k1, v, lam, k_paired=False, weight1=w1, backend=path)
    return diff_attention_pairs(_interleave(q1, q2), _interleave(k1, k2), v, lam, weight1=w1, backend=path)


def _reference(kind, path, x, w1, lam):
    """(O_ref, w1 ⊙ A1 V) in float64 on the rounded inputs."""
    x64 = [t.double() for t in x]
    if x[3] is x[1]:
        x64[3] = x64[1]
    w1_64, lam_64 = _cast(w1, torch.float64), _cast(lam, torch.float64)
    ref_path = "decode" if path == "decode" else "math"
    return _call(kind, ref_path, *x64, w1_64, lam_64), _call(kind, ref_path, *x64, w1_64, 0.0)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("lam", [1.0, 0.8])
@pytest.mark.parametrize("path", ["math", "sdpa", "decode"])
@pytest.mark.parametrize("kind", ["diff", "gated", "diff_v2"])
def test_diffattn_holds_the_bound_when_the_maps_cancel(kind, path, lam, dtype):
    x, w1, lam_t = _case(kind, lam, 1e-3, dtype)
    with torch.no_grad():
        out = _call(kind, path, *x, w1, lam_t)
        ref, first = _reference(kind, path, x, w1, lam_t)
    assert out.dtype == dtype
    if lam == 1.0:  # the subtraction cancels: the output is hundreds of times smaller than the term it came from
        assert first.abs().max() > 100 * ref.abs().max()
    err = (out.double() - ref).abs().max().item()
    assert err <= C * _bound(dtype, ref, first), (err, _bound(dtype, ref, first))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", ["diff", "gated", "diff_v2"])
def test_the_two_call_recipe_breaks_the_bound_when_the_maps_cancel(kind, dtype):
    """Two attention calls in the working precision, subtracted in it (diffusers' processors): each output rounded to
    half precision before the subtraction costs u · max |w1 ⊙ A1 V|, far above the bound's u · max |O|."""
    x, w1, lam_t = _case(kind, 1.0, 1e-3, dtype)
    q1, k1, q2, k2, v = x
    with torch.no_grad():
        gqa = q1.shape[1] != k1.shape[1]
        o1 = F.scaled_dot_product_attention(q1, k1, v, enable_gqa=gqa)
        o2 = F.scaled_dot_product_attention(q2, k2, v, enable_gqa=gqa)
        two_call = _cast(w1, dtype) * o1 - _cast(lam_t, dtype) * o2
        ref, first = _reference(kind, "math", x, w1, lam_t)
    err = (two_call.double() - ref).abs().max().item()
    assert err > 10 * C * _bound(dtype, ref, first), (err, _bound(dtype, ref, first))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", ["diff", "diff_v2", "gqa_masked"])
def test_half_inputs_on_sdpa_are_the_float32_computation_rounded_once(kind, dtype):
    """The ``sdpa`` backend on the CPU runs both calls on float32 copies: bit for bit what float32 inputs holding the
    same values give, rounded once to the dtype (with a float mask, GQA and a per-token λ too)."""
    g = torch.Generator().manual_seed(3)
    mask = None
    if kind == "gqa_masked":
        q1, q2 = torch.randn(2, 4, 32, 16, generator=g), torch.randn(2, 4, 32, 16, generator=g)
        k1, k2 = torch.randn(2, 2, 40, 16, generator=g), torch.randn(2, 2, 40, 16, generator=g)
        v = torch.randn(2, 2, 40, 32, generator=g)
        lam = torch.rand(2, 4, 32, 1, generator=g)
        mask = torch.where(torch.rand(2, 1, 32, 40, generator=g) < 0.2, -1e4, 0.0)
        x = [t.to(dtype) for t in (q1, k1, q2, k2, v)]
        wide = [t.float() for t in x]
        half = diff_attention(*x, lam, attn_mask=mask.to(dtype), backend="sdpa")
        full = diff_attention(*wide, lam, attn_mask=mask.to(dtype).float(), backend="sdpa")
    else:
        x, w1, lam = _case(kind, 0.8, 0.1, dtype)
        wide = [t.float() for t in x]
        if kind == "diff_v2":
            wide[3] = wide[1]
        half = _call(kind, "sdpa", *x, w1, lam)
        full = _call(kind, "sdpa", *wide, w1, lam)
    assert half.dtype == dtype
    assert torch.equal(half, full.to(dtype))


def test_cpu_autocast_keeps_the_subtraction_in_float32():
    """Under CPU autocast (which would run the fused calls in bfloat16) the ``sdpa`` backend gives what it gives
    outside: both calls in float32, one rounding."""
    x, w1, lam = _case("diff", 1.0, 1e-3, torch.bfloat16)
    plain = _call("diff", "sdpa", *x, w1, lam)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = _call("diff", "sdpa", *x, w1, lam)
    assert torch.equal(under, plain)
    wide = [t.float() for t in x]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under32 = _call("diff", "sdpa", *wide, w1, lam)
    assert under32.dtype == torch.float32
    assert torch.equal(under32, _call("diff", "sdpa", *wide, w1, lam))
    x64 = [t.double() for t in x]  # float64 keeps float64, its float mask too
    mask = torch.zeros(1, 1, N, N, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under64 = diff_attention(*x64, 0.5, attn_mask=mask, backend="sdpa")
    assert torch.equal(under64, diff_attention(*x64, 0.5, attn_mask=mask, backend="sdpa"))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_gradients_on_sdpa_are_the_float32_gradients_rounded_once(dtype):
    x, w1, lam = _case("diff", 0.8, 0.1, dtype)
    x = [t[:, :, :64].clone().requires_grad_() for t in x]
    wide = [t.detach().float().requires_grad_() for t in x]
    grad = torch.randn(B, H, 64, 2 * D, generator=torch.Generator().manual_seed(4)).to(dtype)
    _call("diff", "sdpa", *x, w1, lam).backward(grad)
    _call("diff", "sdpa", *wide, w1, lam).backward(grad.float())
    for t, w in zip(x, wide):
        assert t.grad.dtype == dtype
        assert torch.equal(t.grad, w.grad.to(dtype))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_eight_bit_float_inputs_are_refused(name):
    f8 = getattr(torch, name)
    q = torch.randn(1, 2, 8, 16)
    v = torch.randn(1, 2, 8, 32)
    with pytest.raises(ValueError, match=rf"q1 has dtype torch.{name}: 8-bit float inputs are refused.*"
                                         r"float32, bfloat16 or float16"):
        diff_attention(q.to(f8), q.to(f8), q.to(f8), q.to(f8), v.to(f8), 0.5)
    with pytest.raises(ValueError, match=rf"v has dtype torch.{name}"):
        diff_attention(q, q, q, q, v.to(f8), 0.5)
    with pytest.raises(ValueError, match=rf"q has dtype torch.{name}"):
        attention(q.to(f8), q.to(f8), v.to(f8))
