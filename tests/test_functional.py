"""diffattn.functional against an independent float64 reference of O = (w1 ⊙ A1 − λ ⊙ A2) V."""

from __future__ import annotations

import math

import pytest
import torch

from diffattn.functional import attention, causal_mask, diff_attention, prepare_mask, sliding_window_mask

from .reference import F64, TOLERANCES, reference


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.to(F64), b.to(F64)
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make(B=2, H=4, Hkv=4, nq=12, nk=12, d=8, dv=16, dtype=torch.float32, grad=False):
    t = [torch.randn(B, H, nq, d, dtype=dtype), torch.randn(B, Hkv, nk, d, dtype=dtype),
         torch.randn(B, H, nq, d, dtype=dtype), torch.randn(B, Hkv, nk, d, dtype=dtype),
         torch.randn(B, Hkv, nk, dv, dtype=dtype)]
    return [x.requires_grad_(grad) for x in t]


SHAPES = [  # (B, H, Hkv, Nq, Nk, d, dv)
    (2, 4, 4, 12, 12, 8, 16),
    (1, 4, 2, 9, 9, 8, 16),  # GQA
    (2, 6, 1, 7, 7, 16, 32),  # MQA
    (2, 2, 2, 5, 11, 8, 8),  # dv == d, Nq < Nk
]


# --------------------------------------------------------------------------------------------- forward


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_reference(backend, shape, causal):
    B, H, Hkv, nq, nk, d, dv = shape
    q1, k1, q2, k2, v = make(B, H, Hkv, nq, nk, d, dv, dtype=F64)
    lam = 0.37
    out = diff_attention(q1, k1, q2, k2, v, lam, is_causal=causal, backend=backend)
    ref = reference(q1, k1, q2, k2, v, lam, causal=causal)
    assert out.shape == (B, H, nq, dv)
    assert (out - ref).abs().max().item() < 1e-12


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_padding_mask_bool_and_float_with_per_token_weights(backend):
    B, H, nq, nk = 2, 4, 10, 10
    q1, k1, q2, k2, v = make(B, H, H, nq, nk, 8, 16, dtype=F64)
    keep = torch.ones(B, nk, dtype=torch.bool)
    keep[0, 7:] = False
    keep[1, :2] = False
    bool_mask = keep[:, None, None, :]  # (B, 1, 1, Nk)
    float_mask = torch.zeros(B, 1, 1, nk, dtype=F64).masked_fill(~bool_mask, torch.finfo(F64).min)
    g = torch.rand(B, H, nq, 1, dtype=F64)  # the M-DGSA gate: w1 = g, λ = 1 − g
    ref = reference(q1, k1, q2, k2, v, 1 - g, g, allowed=bool_mask, causal=True)
    for m in (bool_mask, float_mask):
        out = diff_attention(q1, k1, q2, k2, v, 1 - g, weight1=g, attn_mask=m, is_causal=True, backend=backend)
        assert (out - ref).abs().max().item() < 1e-12


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_additive_bias_and_per_head_lambda(backend):
    B, H, n = 1, 4, 8
    q1, k1, q2, k2, v = make(B, H, H, n, n, 8, 16, dtype=F64)
    bias = torch.randn(1, H, n, n, dtype=F64)  # ALiBi-like per-head bias
    lam = torch.tensor([0.1, 0.5, 0.9, -0.2], dtype=F64).view(1, H, 1, 1)
    out = diff_attention(q1, k1, q2, k2, v, lam, attn_mask=bias, backend=backend)
    ref = reference(q1, k1, q2, k2, v, lam, bias=bias)
    assert (out - ref).abs().max().item() < 1e-12


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_fully_masked_rows_give_zero_and_finite_grads(backend):
    B, H, nq, nk = 1, 2, 6, 4  # causal with Nq > Nk: the first two query rows see no key
    q1, k1, q2, k2, v = make(B, H, H, nq, nk, 8, 16, grad=True)
    out = diff_attention(q1, k1, q2, k2, v, 0.5, is_causal=True, backend=backend)
    assert torch.equal(out[:, :, :2], torch.zeros_like(out[:, :, :2]))
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    for t in (q1, k1, q2, k2, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q1.grad[:, :, :2], torch.zeros_like(q1.grad[:, :, :2]))
    # an all-False padding row in a bool mask does the same
    m = torch.zeros(B, 1, nq, nk, dtype=torch.bool)
    m[..., 3:, :] = True
    out = diff_attention(q1, k1, q2, k2, v, 0.5, attn_mask=m, backend=backend)
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3])) and torch.isfinite(out).all()


def test_causal_with_cache_is_aligned_to_the_end():
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    q1, k1, q2, k2, v = make(1, 2, 2, 5, 5, 8, 16, dtype=F64)
    full = diff_attention(q1, k1, q2, k2, v, 0.3, is_causal=True)
    last = diff_attention(q1[:, :, 3:], k1, q2[:, :, 3:], k2, v, 0.3, is_causal=True)
    assert (full[:, :, 3:] - last).abs().max().item() < 1e-12


# --------------------------------------------------------------------------------------- backends agree


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-2)])
@pytest.mark.parametrize("causal", [False, True])
def test_backends_agree(dtype, tol, causal):
    q1, k1, q2, k2, v = make(2, 4, 2, 33, 33, 16, 32, dtype=dtype)
    keep = torch.rand(2, 1, 1, 33) > 0.2
    a = diff_attention(q1, k1, q2, k2, v, 0.6, attn_mask=keep, is_causal=causal, backend="math")
    b = diff_attention(q1, k1, q2, k2, v, 0.6, attn_mask=keep, is_causal=causal, backend="sdpa")
    c = diff_attention(q1, k1, q2, k2, v, 0.6, attn_mask=keep, is_causal=causal, backend="auto")
    ref = reference(q1, k1, q2, k2, v, 0.6, allowed=keep, causal=causal)
    assert a.dtype == b.dtype == dtype
    for out in (a, b, c):
        assert rel_err(out, ref) <= tol
    assert rel_err(a, b) <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_backends_agree(dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    grads = {}
    for backend in ("math", "sdpa"):
        torch.manual_seed(1)
        q1, k1, q2, k2, v = make(1, 4, 4, 17, 17, 16, 32, dtype=dtype, grad=True)
        lam = torch.full((1, 4, 1, 1), 0.4, dtype=torch.float32, requires_grad=True)
        out = diff_attention(q1, k1, q2, k2, v, lam, is_causal=True, backend=backend)
        out.float().pow(2).sum().backward()
        grads[backend] = [t.grad.float() for t in (q1, k1, q2, k2, v, lam)]
    for ga, gb in zip(grads["math"], grads["sdpa"]):
        assert rel_err(gb, ga) <= tol


# ------------------------------------------------------------------------------------------- gradcheck


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_gradcheck(backend):
    q1, k1, q2, k2, v = make(1, 2, 1, 5, 6, 4, 8, dtype=F64, grad=True)
    w1 = torch.rand(1, 2, 5, 1, dtype=F64, requires_grad=True)
    lam = torch.rand(1, 2, 1, 1, dtype=F64, requires_grad=True)
    keep = torch.tensor([True, True, False, True, True, True]).view(1, 1, 1, 6)

    def fn(q1, k1, q2, k2, v, w1, lam):
        return diff_attention(q1, k1, q2, k2, v, lam, weight1=w1, attn_mask=keep, is_causal=True, backend=backend)

    assert torch.autograd.gradcheck(fn, (q1, k1, q2, k2, v, w1, lam))


def test_return_weights_are_the_maps():
    q1, k1, q2, k2, v = make(1, 2, 2, 6, 6, 4, 8, dtype=F64)
    out, w = diff_attention(q1, k1, q2, k2, v, 0.25, is_causal=True, return_weights=True)
    assert w.first.shape == (1, 2, 6, 6)
    assert torch.allclose(w.first.sum(-1), torch.ones(1, 2, 6, dtype=F64))
    assert torch.allclose(w.combined, w.first - 0.25 * w.second)
    assert torch.allclose(w.combined.sum(-1), torch.full((1, 2, 6), 0.75, dtype=F64))  # rows sum to 1 − λ
    assert torch.allclose(out, w.combined @ v)
    assert (w.first.triu(1) == 0).all()


# ---------------------------------------------------------------------------- CPU training path (blockwise)


@pytest.fixture
def blockwise_calls(monkeypatch):
    """Small query blocks (several per sequence) and a count of the calls into the blockwise training path."""
    import diffattn.ops.blockwise as blockwise
    import diffattn.ops.functional as functional

    calls = []
    original = blockwise.blockwise_diff_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(blockwise, "BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(blockwise, "MIN_BLOCK_ROWS", 3)  # blocks of 3 query rows, the last one shorter
    monkeypatch.setattr(blockwise, "blockwise_diff_attention", spy)
    monkeypatch.setattr(functional, "BLOCKWISE_MIN_KEYS", 1)  # the short test sequences take it too
    return calls


def _grads_vs_reference(shape, lam, w1, mask=None, bias=None, causal=False, allowed=None):
    """Output and the gradients of q1, k1, q2, k2, v (and of λ, w1 where tensors) through ``sdpa`` and the
    float64 reference, for one random output gradient."""
    B, H, Hkv, nq, nk, d, dv = shape
    ins = make(B, H, Hkv, nq, nk, d, dv, dtype=F64, grad=True)
    extra = [t for t in (lam, w1) if isinstance(t, torch.Tensor)]
    out = diff_attention(*ins, lam, weight1=w1, attn_mask=mask, is_causal=causal, backend="sdpa")
    ref = reference(*ins, lam, w1, allowed=allowed, bias=bias, causal=causal)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, ins + extra, g)
    want = torch.autograd.grad(ref, ins + extra, g)
    return out, ref, got, want


BLOCKWISE_CASES = {  # shape (B, H, Hkv, Nq, Nk, d, dv), λ, w1, mask kind, causal
    "causal": ((2, 4, 4, 13, 13, 8, 16), 0.37, 1.0, None, True),
    "gqa-causal": ((1, 4, 2, 11, 11, 8, 16), 0.6, 1.0, None, True),
    "mqa-padding-bool": ((2, 6, 1, 9, 9, 8, 16), 0.2, 1.0, "bool", False),
    "padding-bool-causal-gate": ((2, 4, 4, 10, 10, 8, 16), "token", "gate", "bool", True),
    "additive-per-head-lambda": ((1, 4, 4, 8, 12, 8, 16), "head", 1.0, "bias", False),
    "finfo-min-float-mask-weight1": ((2, 4, 2, 9, 9, 8, 16), 0.5, "head", "float", True),
}


@pytest.mark.parametrize("case", list(BLOCKWISE_CASES))
def test_blockwise_training_path_matches_reference_and_its_gradients(case, blockwise_calls):
    shape, lam, w1, kind, causal = BLOCKWISE_CASES[case]
    B, H, _, nq, nk, _, _ = shape
    if lam == "token":  # M-DGSA: w1 = g, λ = 1 − g per token and head, both leaves here
        lam = torch.rand(B, H, nq, 1, dtype=F64, requires_grad=True)
    elif lam == "head":
        lam = torch.tensor([0.1, 0.5, 0.9, -0.2], dtype=F64).view(1, H, 1, 1).requires_grad_()
    if w1 == "gate":
        w1 = torch.rand(B, H, nq, 1, dtype=F64, requires_grad=True)
    elif w1 == "head":
        w1 = torch.rand(H, 1, 1, dtype=F64, requires_grad=True)  # 3-D: right-aligned to (B, H, Nq, 1)
    mask = bias = allowed = None
    if kind in ("bool", "float"):
        allowed = torch.rand(B, 1, 1, nk) > 0.3
        allowed[..., 0] = True
        mask = allowed if kind == "bool" else torch.zeros(B, 1, 1, nk, dtype=torch.float32).masked_fill(
            ~allowed, torch.finfo(torch.float32).min)
    elif kind == "bias":
        mask = bias = torch.randn(1, H, nq, nk, dtype=F64)
    out, ref, got, want = _grads_vs_reference(shape, lam, w1, mask=mask, bias=bias, causal=causal,
                                              allowed=allowed)
    assert len(blockwise_calls) == 1  # the training path ran, in blocks of 3 query rows
    assert (out - ref).abs().max().item() < 1e-12
    names = ["dq1", "dk1", "dq2", "dk2", "dv", "dλ", "dw1"][: len(got)]
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape, name
        assert (a - b).abs().max().item() < 1e-11, name


def test_blockwise_blocks_of_several_batch_elements(blockwise_calls, monkeypatch):
    import diffattn.ops.blockwise as blockwise

    monkeypatch.setattr(blockwise, "MIN_BLOCK_ROWS", 8)
    monkeypatch.setattr(blockwise, "BLOCK_ELEMENTS", 256)  # 8 rows × 2 heads × 8 keys: batch elements 0:2, 2:3
    lam = torch.rand(3, 1, 8, 1, dtype=F64, requires_grad=True)
    keep = torch.rand(3, 1, 1, 8) > 0.3
    keep[..., 0] = True
    out, ref, got, want = _grads_vs_reference((3, 2, 2, 8, 8, 8, 32), lam, 1.0, mask=keep, causal=True,
                                              allowed=keep)
    assert len(blockwise_calls) == 1
    assert (out - ref).abs().max().item() < 1e-12
    for a, b in zip(got, want):
        assert (a - b).abs().max().item() < 1e-11


def test_blockwise_fully_masked_rows_give_zero_output_and_gradient(blockwise_calls):
    B, H, n = 1, 2, 7
    q1, k1, q2, k2, v = make(B, H, H, n, n, 8, 16, dtype=F64, grad=True)
    lam = torch.full((1, H, 1, 1), 0.4, dtype=F64, requires_grad=True)
    m = torch.ones(B, 1, n, n, dtype=torch.bool)
    m[..., :3, :] = False  # the first three queries see no key
    out = diff_attention(q1, k1, q2, k2, v, lam, attn_mask=m, is_causal=True, backend="sdpa")
    assert len(blockwise_calls) == 1
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))
    ref = reference(q1, k1, q2, k2, v, lam, allowed=m, causal=True)
    assert (out - ref).abs().max().item() < 1e-12
    out.square().sum().backward()
    for t in (q1, k1, q2, k2, v, lam):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q1.grad[:, :, :3], torch.zeros_like(q1.grad[:, :, :3]))
    assert torch.equal(q2.grad[:, :, :3], torch.zeros_like(q2.grad[:, :, :3]))


def test_blockwise_gradcheck(blockwise_calls):
    q1, k1, q2, k2, v = make(1, 2, 1, 6, 6, 4, 8, dtype=F64, grad=True)
    w1 = torch.rand(1, 2, 6, 1, dtype=F64, requires_grad=True)
    lam = torch.rand(1, 2, 1, 1, dtype=F64, requires_grad=True)
    keep = torch.tensor([True, True, False, True, True, True]).view(1, 1, 1, 6)

    def fn(q1, k1, q2, k2, v, w1, lam):
        return diff_attention(q1, k1, q2, k2, v, lam, weight1=w1, attn_mask=keep, is_causal=True, backend="sdpa")

    assert torch.autograd.gradcheck(fn, (q1, k1, q2, k2, v, w1, lam))
    assert blockwise_calls


@pytest.mark.parametrize("backend", ["auto", "sdpa"])
def test_blockwise_path_is_taken_for_cpu_training_only(backend, blockwise_calls, monkeypatch):
    q1, k1, q2, k2, v = make(1, 2, 2, 8, 8, 8, 16)
    diff_attention(q1, k1, q2, k2, v, 0.5, is_causal=True, backend=backend)  # no gradient: the fused kernels
    assert blockwise_calls == []
    q1.requires_grad_()
    diff_attention(q1, k1, q2, k2, v, 0.5, is_causal=True, backend=backend, dropout_p=0.1)  # dropout: fused
    with torch.no_grad():
        diff_attention(q1, k1, q2, k2, v, 0.5, is_causal=True, backend=backend)
    bf = [t.bfloat16() for t in (q1, k1, q2, k2, v)]
    diff_attention(*bf, 0.5, is_causal=True, backend=backend)  # bf16: the fused kernels' fp32 accumulation
    diff_attention(q1, k1, q2, k2, v[..., :8], 0.5, is_causal=True, backend=backend)  # dv = d: nothing padded
    assert blockwise_calls == []
    out = diff_attention(q1, k1, q2, k2, v, 0.5, is_causal=True, backend=backend)
    assert len(blockwise_calls) == 1
    import diffattn.ops.functional as functional

    monkeypatch.setattr(functional, "BLOCKWISE_MIN_KEYS", 9)  # 8 keys: too short, the fused kernels
    diff_attention(q1, k1, q2, k2, v, 0.5, is_causal=True, backend=backend)
    assert len(blockwise_calls) == 1
    ref = diff_attention(q1.detach(), k1, q2, k2, v, 0.5, is_causal=True, backend=backend)
    assert (out - ref).abs().max().item() < 1e-5  # float32: the same output as the padded fused calls


# ----------------------------------------------------------------------------------- standard attention


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_standard_attention_matches_reference(backend):
    q, k, _, _, v = make(2, 4, 2, 7, 7, 8, 8, dtype=F64)
    keep = torch.rand(2, 1, 1, 7) > 0.3
    out = attention(q, k, v, attn_mask=keep, is_causal=True, backend=backend)
    # standard attention is the λ = 0 case of the reference
    ref = reference(q, k, q, k, v, 0.0, allowed=keep, causal=True)
    assert (out - ref).abs().max().item() < 1e-12


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(lambda_=torch.ones(4)), "lambda_"),  # (H,) right-aligns to the last dim, which must be 1
        (dict(lambda_=torch.ones(3, 1, 1)), "lambda_"),
        (dict(weight1=torch.ones(2, 4, 12, 2)), "weight1"),
        (dict(lambda_=torch.ones(1, dtype=torch.long)), "floating"),
        (dict(attn_mask=torch.ones(2, 1, 12, 5, dtype=torch.bool)), "attn_mask"),
        (dict(attn_mask=torch.ones(2, 1, 1, 12, dtype=torch.int32)), "attn_mask"),
        (dict(backend="flash"), "backend"),
        (dict(dropout_p=1.0), "dropout_p"),
        (dict(backend="sdpa", return_weights=True), "return_weights"),
        (dict(backend="triton"), "triton"),
    ],
)
def test_bad_input_raises_clear_error(kwargs, match):
    q1, k1, q2, k2, v = make()
    lam = kwargs.pop("lambda_", 0.5)
    with pytest.raises(ValueError, match=match):
        diff_attention(q1, k1, q2, k2, v, lam, **kwargs)


def test_bad_shapes_raise():
    q1, k1, q2, k2, v = make(H=4, Hkv=4)
    with pytest.raises(ValueError, match="divisible"):
        diff_attention(q1, k1[:, :3], q2, k2[:, :3], v[:, :3], 0.5)
    with pytest.raises(ValueError, match="q2"):
        diff_attention(q1, k1, q2[:, :2], k2, v, 0.5)
    with pytest.raises(ValueError, match="v must have shape"):
        diff_attention(q1, k1, q2, k2, v[:, :, :5], 0.5)
    with pytest.raises(ValueError, match="dtype"):
        diff_attention(q1, k1, q2.double(), k2, v, 0.5)
    with pytest.raises(ValueError, match="4-D"):
        diff_attention(q1[0], k1, q2, k2, v, 0.5)


_MEMORY_SCRIPT = """
import json, torch
from diffattn.functional import diff_attention
from diffattn.utils import peak_memory_mb
torch.manual_seed(0)
q1, k1, q2, k2 = (torch.randn(1, 2, 4096, 32) for _ in range(4))
v = torch.randn(1, 2, 4096, 64)
out = {}
with torch.no_grad():
    for backend in ("sdpa", "math", "sdpa"):
        out[backend] = peak_memory_mb(lambda: diff_attention(q1, k1, q2, k2, v, 0.5, backend=backend))
print(json.dumps(out))
"""


def test_sdpa_peak_memory_is_a_small_fraction_of_math():
    """At N = 4096 the math backend holds N×N maps; sdpa must not (peak RSS in a fresh process, Linux)."""
    import json
    import os
    import subprocess
    import sys

    from diffattn.utils import MALLOC_ENV, peak_memory_mb

    if peak_memory_mb(lambda: None) is None:
        pytest.skip("peak RSS needs Linux /proc/self/clear_refs")
    res = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], env={**os.environ, **MALLOC_ENV},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    peaks = json.loads(res.stdout.strip().splitlines()[-1])
    maps_mib = 2 * 4096 * 4096 * 2 * 4 / 2**20  # two fp32 (B, H, N, N) maps
    assert peaks["math"] > 0.9 * maps_mib
    assert peaks["sdpa"] < 0.05 * peaks["math"], peaks


# ------------------------------------------------------------------------------ soft-capping, windows, masks


@pytest.mark.parametrize("fn", ["diff", "standard"])
def test_softcap_matches_reference_and_auto_picks_math(fn):
    q1, k1, q2, k2, v = make(2, 4, 2, 6, 9, 8, 16, dtype=F64)
    q1, q2 = q1 * 6, q2 * 6  # logits well past the cap
    keep = torch.rand(2, 1, 1, 9) > 0.3
    c = 3.0
    if fn == "diff":
        ref = reference(q1, k1, q2, k2, v, 0.4, allowed=keep, causal=True, softcap=c)
        for backend in ("auto", "math"):
            out = diff_attention(q1, k1, q2, k2, v, 0.4, attn_mask=keep, is_causal=True, softcap=c, backend=backend)
            assert (out - ref).abs().max().item() < 1e-12
        uncapped = diff_attention(q1, k1, q2, k2, v, 0.4, attn_mask=keep, is_causal=True)
        assert (uncapped - ref).abs().max().item() > 1e-3  # the cap changes the answer
    else:
        ref = reference(q1, k1, q1, k1, v, 0.0, allowed=keep, causal=True, softcap=c)
        for backend in ("auto", "math"):
            out = attention(q1, k1, v, attn_mask=keep, is_causal=True, softcap=c, backend=backend)
            assert (out - ref).abs().max().item() < 1e-12
        _, maps = attention(q1, k1, v, softcap=c, return_weights=True)
        s = c * torch.tanh(q1 @ k1.repeat_interleave(2, 1).transpose(-1, -2) / 8**0.5 / c)
        assert (maps - torch.softmax(s, -1)).abs().max().item() < 1e-12


@pytest.mark.parametrize("backend", ["sdpa", "triton"])
def test_softcap_on_a_kernel_backend_is_a_clear_error(backend):
    q1, k1, q2, k2, v = make()
    with pytest.raises(ValueError, match="softcap"):
        diff_attention(q1, k1, q2, k2, v, 0.5, softcap=5.0, backend=backend)
    if backend == "sdpa":
        with pytest.raises(ValueError, match="softcap"):
            attention(q1, k1, v, softcap=5.0, backend=backend)
    for bad in (0.0, -1.0, float("inf"), float("nan"), "5"):
        with pytest.raises(ValueError, match="softcap"):
            diff_attention(q1, k1, q2, k2, v, 0.5, softcap=bad)


def test_sliding_window_mask_convention():
    m = sliding_window_mask(3, 6, 2)  # queries at key positions 3, 4, 5
    expect = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert m.dtype == torch.bool and torch.equal(m, expect)
    for nq, nk, w in ((5, 5, 1), (4, 9, 3), (7, 7, 100), (6, 2, 2)):
        m = sliding_window_mask(nq, nk, w)
        for i in range(nq):
            for j in range(nk):
                assert bool(m[i, j]) == (0 <= i + nk - nq - j < w)
    assert torch.equal(sliding_window_mask(6, 6, 6), causal_mask(6, 6))
    for bad in (dict(window=0), dict(window=2.5), dict(nq=-1), dict(window=True)):
        args = dict(nq=3, nk=3, window=2) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            sliding_window_mask(**args)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_sliding_window_through_the_operator(backend):
    q1, k1, q2, k2, v = make(1, 2, 2, 7, 7, 8, 16, dtype=F64)
    w = sliding_window_mask(7, 7, 3)
    out = diff_attention(q1, k1, q2, k2, v, 0.3, attn_mask=w, backend=backend)
    assert (out - reference(q1, k1, q2, k2, v, 0.3, allowed=w)).abs().max().item() < 1e-12


MASK_DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("qdtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mdtype", MASK_DTYPES)
@pytest.mark.parametrize("backend", ["auto", "math", "sdpa"])
def test_finfo_min_padding_mask_of_any_dtype_is_exact(qdtype, mdtype, backend):
    """Hugging Face fills padding with finfo(dtype).min; in another dtype that may overflow to −inf (then NaN in a
    fully masked row) or, unconverted, reach a kernel that misreads it. Every combination gives the reference."""
    B, H, nq, nk = 2, 2, 5, 20
    q1, k1, q2, k2, v = make(B, H, H, nq, nk, 8, 16, dtype=qdtype)
    keep = torch.ones(B, 1, nq, nk, dtype=torch.bool)
    keep[0, :, :, 15:] = False
    keep[1, :, 2] = False  # a fully masked row
    mask = torch.zeros(B, 1, nq, nk, dtype=mdtype).masked_fill(~keep, torch.finfo(mdtype).min)
    out = diff_attention(q1, k1, q2, k2, v, 0.3, attn_mask=mask, backend=backend)
    ref = reference(q1, k1, q2, k2, v, 0.3, allowed=keep)
    assert out.dtype == qdtype and torch.isfinite(out).all()
    assert torch.equal(out[1, :, 2], torch.zeros_like(out[1, :, 2]))
    torch.testing.assert_close(out.double(), ref, **TOLERANCES[qdtype])
    out_std = attention(q1, k1, v, attn_mask=mask, backend=backend)
    ref_std = reference(q1, k1, q1, k1, v, 0.0, allowed=keep)
    torch.testing.assert_close(out_std.double(), ref_std, **TOLERANCES[qdtype])


def test_prepare_mask_is_the_one_conversion():
    m64 = torch.tensor([0.0, -1.0, torch.finfo(F64).min, -math.inf], dtype=F64)
    pm = prepare_mask(m64, is_causal=False, nq=1, nk=4, dtype=torch.float32, device=torch.device("cpu"))
    assert pm.keep.shape == (1, 1, 1, 4) and pm.keep.tolist() == [[[[True, True, False, False]]]]
    assert pm.bias.dtype == torch.float32 and pm.bias.flatten().tolist() == [0.0, -1.0, 0.0, 0.0]
    assert pm.row_ok.all()
    # a finite value beyond the target range is clamped, not turned into −inf
    big = torch.tensor([-1e300, 0.0], dtype=F64)
    pm = prepare_mask(big, is_causal=False, nq=1, nk=2, dtype=torch.float32, device=torch.device("cpu"))
    assert pm.bias.flatten()[0].item() == torch.finfo(torch.float32).min
    # causal with nq > nk leaves rows with no key: reported, and opened so kernels stay finite
    pm = prepare_mask(None, is_causal=True, nq=4, nk=2, dtype=torch.float32, device=torch.device("cpu"))
    assert pm.row_ok.flatten().tolist() == [False, False, True, True] and pm.keep.all(-1).flatten()[:2].all()


# ------------------------------------------------------------------------------ reliability regressions


@pytest.mark.parametrize("qdtype,mdtype", [(torch.float32, torch.float16), (torch.float32, torch.float64),
                                           (torch.float64, torch.float32), (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
def test_float_mask_of_another_dtype_is_converted(qdtype, mdtype, backend):
    """A float mask in another dtype than q used to pass validation and crash SDPA, or (float64 q with a float32
    mask, Nk ≥ 16) give silently wrong results on CPU."""
    q1, k1, q2, k2, v = make(2, 2, 2, 6, 20, 8, 16, dtype=qdtype)
    bias = torch.randn(2, 1, 6, 20).to(mdtype)
    zero = torch.zeros(2, 1, 6, 20, dtype=mdtype)
    out = diff_attention(q1, k1, q2, k2, v, 0.4, attn_mask=bias, backend=backend)
    torch.testing.assert_close(out.double(), reference(q1, k1, q2, k2, v, 0.4, bias=bias), **TOLERANCES[qdtype])
    plain = diff_attention(q1, k1, q2, k2, v, 0.4, backend=backend)
    torch.testing.assert_close(diff_attention(q1, k1, q2, k2, v, 0.4, attn_mask=zero, backend=backend), plain,
                               rtol=0, atol=1e-6 if qdtype != torch.bfloat16 else 1e-2)


@pytest.mark.parametrize("shape", [(), (20,), (6, 20), (1, 6, 20)])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
def test_low_dimensional_masks_broadcast(shape, backend):
    q1, k1, q2, k2, v = make(2, 2, 2, 6, 20, 8, 16, dtype=F64)
    keep = torch.rand(shape) > 0.3 if shape else torch.tensor(True)
    out = diff_attention(q1, k1, q2, k2, v, 0.4, attn_mask=keep, backend=backend)
    assert (out - reference(q1, k1, q2, k2, v, 0.4, allowed=keep)).abs().max().item() < 1e-12
    out = attention(q1, k1, v, attn_mask=keep, backend=backend)
    assert (out - reference(q1, k1, q1, k1, v, 0.0, allowed=keep)).abs().max().item() < 1e-12


def test_zero_width_and_zero_kv_heads_are_clear_errors():
    q = torch.randn(1, 2, 3, 0)
    with pytest.raises(ValueError, match="head width"):
        diff_attention(q, q, q, q, torch.randn(1, 2, 3, 4), 0.5)
    with pytest.raises(ValueError, match="head width"):
        attention(q, q, torch.randn(1, 2, 3, 4))
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 0, 3, 4)
    with pytest.raises(ValueError, match="head"):
        diff_attention(q, k, q, k, torch.randn(1, 0, 3, 4), 0.5)


@pytest.mark.parametrize("scale", [0.0, -0.5])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
def test_causal_with_non_positive_scale(scale, backend):
    q1, k1, q2, k2, v = make(1, 2, 2, 20, 20, 8, 16, dtype=torch.float32)
    out = diff_attention(q1, k1, q2, k2, v, 0.4, is_causal=True, scale=scale, backend=backend)
    ref = reference(q1, k1, q2, k2, v, 0.4, causal=True, scale=scale)
    torch.testing.assert_close(out.double(), ref, **TOLERANCES[torch.float32])
    out = attention(q1, k1, v, is_causal=True, scale=scale, backend=backend)
    torch.testing.assert_close(out.double(), reference(q1, k1, q1, k1, v, 0.0, causal=True, scale=scale),
                               **TOLERANCES[torch.float32])


@pytest.mark.parametrize("dtype,mult", [(torch.float16, 100.0), (torch.bfloat16, 10.0)])
def test_maps_compute_scores_in_float32(dtype, mult):
    """Q Kᵀ of large half-precision inputs overflows (fp16) or rounds (bf16) when formed in the input dtype."""
    q1, k1, q2, k2, v = make(1, 2, 2, 8, 8, 16, 16, dtype=torch.float32)
    q1, k1, q2, k2 = (t * mult for t in (q1, k1, q2, k2))
    q1, k1, q2, k2, v = (t.to(dtype).requires_grad_(True) for t in (q1, k1, q2, k2, v))
    out, maps = diff_attention(q1, k1, q2, k2, v, 0.4, return_weights=True)
    ref = reference(q1, k1, q2, k2, v, 0.4)
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item() / ref.abs().max().item()
    assert err < 2e-2
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q1, k1, q2, k2, v))
    assert maps.first.dtype == torch.float32
    _, p = attention(q1.detach(), k1.detach(), v.detach(), return_weights=True)
    assert torch.isfinite(p).all()


def test_standard_attention_weights_need_math_like_diff_attention():
    q1, k1, q2, k2, v = make()
    for fn in (lambda: attention(q1, k1, v, return_weights=True, backend="sdpa"),
               lambda: diff_attention(q1, k1, q2, k2, v, 0.5, return_weights=True, backend="sdpa")):
        with pytest.raises(ValueError, match="return_weights"):
            fn()


def test_numpy_scalar_lambda_is_accepted():
    np = pytest.importorskip("numpy")
    q1, k1, q2, k2, v = make(dtype=F64)
    ref = diff_attention(q1, k1, q2, k2, v, 0.25)
    for lam in (np.float32(0.25), np.float64(0.25), np.float16(0.25)):
        assert torch.equal(diff_attention(q1, k1, q2, k2, v, lam), ref)
    for bad in (float("nan"), float("inf"), True, "0.5", None):
        with pytest.raises(ValueError, match="lambda_"):
            diff_attention(q1, k1, q2, k2, v, bad)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
def test_empty_batch_and_sequences(backend):
    for B, nq, nk in ((0, 4, 4), (2, 0, 4), (2, 4, 0)):
        q1, k1, q2, k2, v = make(B, 2, 2, nq, nk, 8, 16, grad=True)
        out = diff_attention(q1, k1, q2, k2, v, 0.4, backend=backend, is_causal=nq == nk)
        assert out.shape == (B, 2, nq, 16) and (out == 0).all()
        out.sum().backward()
        assert attention(q1, k1, v, backend=backend).shape == (B, 2, nq, 16)


def test_choose_backend_names_the_path_auto_takes_and_why():
    """``choose_backend`` says which path ``backend="auto"`` runs and why, and ``diff_attention`` runs that path."""
    from diffattn.functional import choose_backend, decode_diff_attention

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 16, generator=g), torch.randn(1, 2, 5, 16, generator=g)
    v = torch.randn(1, 2, 5, 32, generator=g)
    c = choose_backend(q, k, q, k, v, 0.5)
    assert c.backend == "sdpa" and "padded to the value width" in c.reason and str(c).startswith("sdpa: ")
    c = choose_backend(q, k, q, k, v, 0.5, return_weights=True)
    assert (c.backend, c.reason) == ("math", "return_weights=True needs the attention maps, which only math builds")
    assert choose_backend(q, k, q, k, v, 0.5, softcap=5.0).backend == "math"
    c = choose_backend(q[:, :, :2], k, q[:, :, :2], k, v, 0.5)
    assert c.backend == "decode" and "2 query rows against 5 keys" in c.reason
    out = diff_attention(q[:, :, :2], k, q[:, :, :2], k, v, 0.5)
    torch.testing.assert_close(out, decode_diff_attention(q[:, :, :2], k, q[:, :, :2], k, v, 0.5,
                                                          scale=16 ** -0.5), rtol=0, atol=0)
    long_q = torch.randn(1, 2, 600, 16, generator=g).requires_grad_()
    c = choose_backend(long_q, long_q, long_q, long_q, torch.randn(1, 2, 600, 32, generator=g), 0.5)
    assert c.backend == "blockwise" and "from 512 keys on (here 600)" in c.reason
    with pytest.raises(ValueError, match="lambda_"):
        choose_backend(q, k, q, k, v, "0.5")
