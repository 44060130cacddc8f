"""Tests of the fused Triton differential-attention kernel against an independent float64 reference.

Without a GPU the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set below before Triton
defines them): float32 only, tiny shapes, 16×16 tiles so that multi-tile loops, causal diagonal tiles and
ragged edges are exercised. With a GPU the same float32 cases run compiled, and the bfloat16 cases run too.
"""

from __future__ import annotations

import os

import torch

CUDA = torch.cuda.is_available()
if not CUDA:  # must happen before Triton defines the kernels (at import of diffattn.ops.kernels)
    os.environ["TRITON_INTERPRET"] = "1"

import importlib  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402

import diffattn.ops.kernels.triton_diff as triton_diff  # noqa: E402
from diffattn.ops.kernels import triton_diff_attention, triton_unsupported_reason  # noqa: E402

from .gpu_report import record  # noqa: E402

if not CUDA:
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(triton_diff._diff_attn_fwd_kernel, InterpretedFunction):
        importlib.reload(triton_diff)  # imported before TRITON_INTERPRET was set: define the kernels again

DEVICE = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (half precision does not run in the interpreter)")


# ---------------------------------------------------------------------------------------------- reference


def reference(q1, k1, q2, k2, v, lambda_, weight1=1.0, attn_mask=None, is_causal=False, scale=None):
    """(w1 ⊙ A1 − λ ⊙ A2) V in float64, explicit softmax; fully masked rows give 0 (and zero gradients)."""
    q1, k1, q2, k2, v = (t.double() for t in (q1, k1, q2, k2, v))
    B, H, Nq, d = q1.shape
    Nk = k1.shape[2]
    groups = H // k1.shape[1]
    k1, k2, v = (t.repeat_interleave(groups, dim=1) for t in (k1, k2, v))
    scale = 1.0 / math.sqrt(d) if scale is None else scale

    allowed = torch.ones(B, H, Nq, Nk, dtype=torch.bool, device=q1.device)
    bias = torch.zeros(B, H, Nq, Nk, dtype=torch.float64, device=q1.device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        else:
            blocked = attn_mask <= torch.finfo(attn_mask.dtype).min / 2
            allowed = allowed & ~blocked
            bias = bias + attn_mask.double().masked_fill(blocked, 0.0)
    if is_causal:
        i = torch.arange(Nq, device=q1.device)[:, None]
        j = torch.arange(Nk, device=q1.device)[None, :]
        allowed = allowed & (j <= i + (Nk - Nq))

    def attn(q, k):
        s = (q @ k.transpose(-2, -1)) * scale + bias
        s = s.masked_fill(~allowed, float("-inf"))
        m = s.amax(-1, keepdim=True).detach()
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(s - m)  # masked entries are exactly 0
        den = e.sum(-1, keepdim=True)
        return e / torch.where(den > 0, den, torch.ones_like(den))

    w1 = weight1.double() if isinstance(weight1, torch.Tensor) else weight1
    lam = lambda_.double() if isinstance(lambda_, torch.Tensor) else lambda_
    return (w1 * attn(q1, k1) - lam * attn(q2, k2)) @ v


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


# ------------------------------------------------------------------------------------------------ harness


def make_inputs(B=1, H=2, Hkv=None, Nq=40, Nk=None, d=16, dv=None, dtype=torch.float32, seed=0):
    Hkv = H if Hkv is None else Hkv
    Nk = Nq if Nk is None else Nk
    dv = 2 * d if dv is None else dv
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype).requires_grad_()

    return rnd(B, H, Nq, d), rnd(B, Hkv, Nk, d), rnd(B, H, Nq, d), rnd(B, Hkv, Nk, d), rnd(B, Hkv, Nk, dv)


def check(qkv, lambda_, weight1=1.0, attn_mask=None, is_causal=False, scale=None, tol=1e-4, zero_rows=None):
    """Compare output and all gradients (q1, k1, q2, k2, v and tensor weights) with the float64 reference."""
    weights = [w for w in (lambda_, weight1) if isinstance(w, torch.Tensor) and w.requires_grad]
    leaves = list(qkv) + [w for w in weights if w.is_leaf]
    out = triton_diff_attention(*qkv, lambda_, weight1=weight1, attn_mask=attn_mask, is_causal=is_causal,
                                scale=scale)
    ref = reference(*qkv, lambda_, weight1, attn_mask, is_causal, scale)
    assert out.dtype == qkv[4].dtype and out.shape == ref.shape
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) <= tol, f"output rel err {rel_err(out, ref):.2e}"

    g = torch.Generator().manual_seed(1)
    grad_out = torch.randn(out.shape, generator=g).to(out)
    got = torch.autograd.grad(out, leaves, grad_out)
    want = torch.autograd.grad(ref, leaves, grad_out.double())
    names = ["q1", "k1", "q2", "k2", "v"] + [f"weight{i}" for i in range(len(leaves) - 5)]
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape and a.dtype == leaves[names.index(name)].dtype, name
        assert torch.isfinite(a).all(), f"{name} grad not finite"
        assert rel_err(a, b) <= tol, f"{name} grad rel err {rel_err(a, b):.2e}"
    if zero_rows is not None:  # (B, H, Nq) bool: rows whose keys are all masked give exactly 0
        assert zero_rows.any()
        assert (out[zero_rows] == 0).all()
        assert (got[0][zero_rows] == 0).all() and (got[2][zero_rows] == 0).all()
    return out


# ------------------------------------------------------------------------------------------ float32 cases


def test_non_causal_per_layer_lambda():
    check(make_inputs(B=2, H=2, Nq=37, d=16), 0.8)


def test_causal_square():
    check(make_inputs(B=1, H=2, Nq=48, d=32), 0.5, is_causal=True)


@pytest.mark.parametrize("nq", [1, 5])
def test_causal_decoding_nq_less_than_nk(nq):
    check(make_inputs(B=2, H=2, Nq=nq, Nk=41, d=16), 0.3, is_causal=True)


def test_causal_nq_greater_than_nk_gives_zero_rows():
    qkv = make_inputs(B=1, H=2, Nq=40, Nk=22, d=16)
    zero = torch.zeros(1, 2, 40, dtype=torch.bool, device=DEVICE)
    zero[..., :18] = True  # query i sees keys j ≤ i − 18
    check(qkv, 0.7, is_causal=True, zero_rows=zero)


def test_key_padding_bool_with_fully_masked_batch_row():
    B, Nk = 2, 35
    mask = torch.ones(B, 1, 1, Nk, dtype=torch.bool, device=DEVICE)
    mask[0, ..., 20:] = False  # padding
    mask[1] = False  # every key of batch element 1 is masked
    zero = torch.zeros(B, 2, 30, dtype=torch.bool, device=DEVICE)
    zero[1] = True
    check(make_inputs(B=B, H=2, Nq=30, Nk=Nk, d=16), 0.8, attn_mask=mask, zero_rows=zero)


def test_key_padding_additive_float_and_causal():
    B, N = 2, 33
    g = torch.Generator().manual_seed(3)
    mask = (0.5 * torch.randn(B, 1, 1, N, generator=g)).to(DEVICE)  # finite biases are added to the scores
    mask[0, ..., 25:] = float("-inf")
    mask[1, ..., :4] = torch.finfo(torch.float32).min  # ≤ finfo.min / 2 counts as masked
    check(make_inputs(B=B, H=2, Nq=N, d=16), 0.6, attn_mask=mask, is_causal=True)


@pytest.mark.parametrize("shape", [(29,), (1, 29), (1, 1, 29)])
def test_key_padding_broadcast_shapes(shape):
    mask = torch.ones(shape, dtype=torch.bool, device=DEVICE)
    mask[..., 7:11] = False
    check(make_inputs(B=2, H=2, Nq=20, Nk=29, d=16), 0.8, attn_mask=mask)


@pytest.mark.parametrize("hkv", [2, 1])
def test_gqa(hkv):
    check(make_inputs(B=1, H=4, Hkv=hkv, Nq=36, d=16), 0.8, is_causal=True)


def test_per_head_lambda_tensor_gets_grad():
    lam = torch.tensor([0.2, 0.9], device=DEVICE).view(1, 2, 1, 1).requires_grad_()
    check(make_inputs(B=2, H=2, Nq=24, d=16), lam)


def test_per_token_and_head_weights_get_grads():
    B, H, N = 2, 2, 26
    g = torch.Generator().manual_seed(5)
    w1 = torch.rand(B, H, N, 1, generator=g).to(DEVICE).requires_grad_()
    lam = torch.rand(B, H, N, 1, generator=g).to(DEVICE).requires_grad_()
    check(make_inputs(B=B, H=H, Nq=N, d=16), lam, weight1=w1, is_causal=True)


def test_mdgsa_gate_grad_flows_through_both_weights():
    B, H, N = 1, 2, 24
    gate = torch.rand(B, H, N, 1, generator=torch.Generator().manual_seed(6)).to(DEVICE).requires_grad_()
    check(make_inputs(B=B, H=H, Nq=N, d=16), 1.0 - gate, weight1=gate)  # weight1 = g, λ = 1 − g


@pytest.mark.parametrize("d,dv", [(16, 16), (32, 32), (32, 64)])
def test_value_width(d, dv):
    check(make_inputs(B=1, H=2, Nq=34, d=d, dv=dv), 0.8, is_causal=True)


def test_custom_scale_and_strided_inputs():
    B, H, N, d = 1, 2, 21, 16
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(B, N, 5, H, 2 * d, generator=g).to(DEVICE)  # a fused projection, heads-last layout
    q1, k1, q2, k2, v = (qkv[:, :, i, :, :d if i < 4 else 2 * d].transpose(1, 2) for i in range(5))
    leaves = [t.detach().requires_grad_() for t in (q1, k1, q2, k2)] + [v.detach().requires_grad_()]
    assert not leaves[0].is_contiguous()
    check(leaves, 0.8, scale=0.3)


def test_no_grad_matches_grad_path():
    qkv = make_inputs(B=1, H=2, Nq=20, d=16)
    with torch.no_grad():
        a = triton_diff_attention(*qkv, 0.8, is_causal=True)
    b = triton_diff_attention(*qkv, 0.8, is_causal=True)
    assert not a.requires_grad and b.requires_grad
    torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)


# --------------------------------------------------------------------------------------- unsupported inputs


def _args(**over):
    q1, k1, q2, k2, v = (t.detach() for t in make_inputs(B=2, H=2, Nq=8, d=16))
    args = dict(q1=q1, k1=k1, q2=q2, k2=k2, v=v, lambda_=0.8, weight1=1.0, attn_mask=None, is_causal=False,
                dropout_p=0.0)
    args.update(over)
    return args


def _reason(**over):
    return triton_unsupported_reason(*_args(**over).values())


def test_supported_inputs_have_no_reason():
    assert _reason() is None
    assert _reason(attn_mask=torch.ones(2, 1, 1, 8, dtype=torch.bool, device=DEVICE)) is None


@pytest.mark.parametrize("case,fragment", [
    ("dropout", "dropout"),
    ("head_width", "head width"),
    ("value_width", "value width"),
    ("float64", "dtype"),
    ("meta_device", "CUDA"),
    ("per_query_mask", "key-padding"),
    ("per_head_mask", "key-padding"),
    ("int_mask", "attn_mask"),
    ("gqa_heads", "multiple"),
    ("shape_mismatch", "shape"),
    ("lambda_shape", "lambda_"),
    ("weight_type", "weight1"),
    ("not_a_tensor", "q1"),
])
def test_unsupported_reasons(case, fragment):
    a = _args()
    q, k, v = a["q1"], a["k1"], a["v"]
    over = {
        "dropout": dict(dropout_p=0.1),
        "head_width": dict(q1=q[..., :8], q2=q[..., :8], k1=k[..., :8], k2=k[..., :8], v=v[..., :16]),
        "value_width": dict(v=torch.cat([v, v[..., :16]], -1)),
        "float64": dict(q1=q.double(), k1=k.double(), q2=q.double(), k2=k.double(), v=v.double()),
        "meta_device": {n: a[n].to("meta") for n in ("q1", "k1", "q2", "k2", "v")},
        "per_query_mask": dict(attn_mask=torch.ones(2, 1, 8, 8, dtype=torch.bool, device=DEVICE)),
        "per_head_mask": dict(attn_mask=torch.zeros(1, 2, 1, 8, device=DEVICE)),
        "int_mask": dict(attn_mask=torch.ones(2, 1, 1, 8, dtype=torch.int64, device=DEVICE)),
        "gqa_heads": dict(q1=torch.cat([q, q[:, :1]], 1), q2=torch.cat([q, q[:, :1]], 1)),
        "shape_mismatch": dict(v=v[:, :, :5]),
        "lambda_shape": dict(lambda_=torch.ones(3, 1, 1, device=DEVICE)),
        "weight_type": dict(weight1="one"),
        "not_a_tensor": dict(q1=None),
    }[case]
    a.update(over)
    reason = triton_unsupported_reason(*a.values())
    assert isinstance(reason, str) and fragment.lower() in reason.lower(), reason
    kw = {k: a[k] for k in ("weight1", "attn_mask", "is_causal", "dropout_p")}
    with pytest.raises(ValueError, match="cannot run"):
        triton_diff_attention(a["q1"], a["k1"], a["q2"], a["k2"], a["v"], a["lambda_"], **kw)


# ------------------------------------------------------------------------ the operator, torch.compile, opcheck


def _op_args(requires_grad=True):
    qkv = make_inputs(B=1, H=2, Nq=20, d=16)
    if not requires_grad:
        qkv = [t.detach() for t in qkv]
    lam = torch.rand(1, 2, 20, 1, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    return qkv, lam.requires_grad_(requires_grad)


def test_operator_passes_opcheck():
    """The registered operators have a consistent schema, fake (meta) implementation and autograd formula
    (torch.library.opcheck: schema, faketensor, autograd registration, AOT dispatch with dynamic shapes)."""
    qkv, lam = _op_args()
    w1 = torch.full((), 1.0, device=DEVICE)
    torch.library.opcheck(triton_diff._fwd_op, (*qkv, lam, w1, None, True, 0.25, True))
    mask = torch.zeros(1, 20, device=DEVICE)
    mask[:, 15:] = float("-inf")
    torch.library.opcheck(triton_diff._fwd_op, (*[t.detach() for t in qkv], lam.detach(), w1, mask, False, 0.25,
                                                False))
    o, o1, o2, lse = triton_diff._fwd_op(*[t.detach() for t in qkv], lam.detach(), w1, None, True, 0.25, True)
    do = torch.randn_like(o)
    torch.library.opcheck(triton_diff._bwd_op, (do, *[t.detach() for t in qkv], o1, o2, lse, lam.detach(), w1,
                                                None, True, 0.25))


def test_compiles_fullgraph_through_the_operator():
    """torch.compile(fullgraph=True) traces through the kernel (fake implementation, no graph break) and AOTAutograd
    through its backward operator; output and every gradient match eager exactly (the same kernels run)."""
    torch._dynamo.reset()
    qkv, lam = _op_args()
    mask = torch.ones(1, 1, 1, 20, dtype=torch.bool, device=DEVICE)
    mask[..., 17:] = False

    def f(q1, k1, q2, k2, v, lam):
        return triton_diff_attention(q1, k1, q2, k2, v, lam, weight1=1.0 - lam, attn_mask=mask, is_causal=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out, ref = compiled(*qkv, lam), f(*qkv, lam)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, [*qkv, lam], g)
    want = torch.autograd.grad(ref, [*qkv, lam], g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------- half precision on a GPU


BF16_CASES = {
    "non_causal": dict(shape=dict(B=2, H=4, Nq=200, d=64), kw=dict(lambda_=0.8)),
    "causal_d128_dv256": dict(shape=dict(B=1, H=2, Nq=300, d=128), kw=dict(lambda_=0.8, is_causal=True)),
    "causal_d128_dv128": dict(shape=dict(B=1, H=2, Nq=150, d=128, dv=128),
                              kw=dict(lambda_=0.5, is_causal=True)),
    "decoding": dict(shape=dict(B=2, H=2, Nq=7, Nk=333, d=64), kw=dict(lambda_=0.8, is_causal=True)),
    "nq_gt_nk": dict(shape=dict(B=1, H=2, Nq=160, Nk=90, d=32), kw=dict(lambda_=0.8, is_causal=True)),
    "gqa": dict(shape=dict(B=1, H=8, Hkv=2, Nq=257, d=64), kw=dict(lambda_=0.8, is_causal=True)),
    "mqa_dv_eq_d": dict(shape=dict(B=2, H=4, Hkv=1, Nq=130, d=64, dv=64), kw=dict(lambda_=0.3)),
}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(BF16_CASES))
def test_bf16_cuda(name):
    case = BF16_CASES[name]
    check(make_inputs(dtype=torch.bfloat16, **case["shape"]), tol=2e-2, **case["kw"])


@pytest.mark.gpu
@needs_cuda
def test_bf16_cuda_mask_and_gate():
    B, H, N = 2, 4, 190
    qkv = make_inputs(B=B, H=H, Nq=N, d=64, dtype=torch.bfloat16)
    mask = torch.ones(B, 1, 1, N, dtype=torch.bool, device=DEVICE)
    mask[0, ..., 150:] = False
    gate = torch.rand(B, H, N, 1, device=DEVICE).requires_grad_()
    check(qkv, 1.0 - gate, weight1=gate, attn_mask=mask, is_causal=True, tol=2e-2)
    lam = torch.rand(1, H, 1, 1, device=DEVICE).requires_grad_()
    check(qkv, lam, attn_mask=mask, tol=2e-2)


#: tolerance on ‖x − ref‖ / ‖ref‖ against the float64 reference, output and every gradient: P and dS are rounded
#: to the input dtype before their matmuls (8 or 11 significant bits), as in FlashAttention-2
HALF_TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2}


def _grads_of(out, leaves, grad_out):
    return torch.autograd.grad(out, leaves, grad_out)


def compare_with_reference_and_sdpa(name, qkv, lambda_, weight1=1.0, attn_mask=None, is_causal=False):
    """The fused kernel in half precision against (1) the float64 reference, within HALF_TOL, and (2) the
    ``sdpa`` backend on the same half-precision inputs: the kernel's error must not exceed twice that backend's
    (+ 1e-3). Output and the gradients of q1, k1, q2, k2, v and of tensor weights that require grad."""
    from diffattn.functional import diff_attention

    dtype = qkv[0].dtype
    weights = [w for w in (lambda_, weight1) if isinstance(w, torch.Tensor) and w.requires_grad and w.is_leaf]
    leaves = list(qkv) + weights
    kw = dict(weight1=weight1, attn_mask=attn_mask, is_causal=is_causal)
    out = diff_attention(*qkv, lambda_, backend="triton", **kw)
    alt = diff_attention(*qkv, lambda_, backend="sdpa", **kw)
    ref = reference(*qkv, lambda_, weight1, attn_mask, is_causal)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    got, other = _grads_of(out, leaves, grad_out), _grads_of(alt, leaves, grad_out)
    want = _grads_of(ref, leaves, grad_out.double())
    names = ["out", "q1", "k1", "q2", "k2", "v"] + [f"weight{i}" for i in range(len(weights))]
    errs = {}
    for n, a, b, c in zip(names, (out, *got), (alt, *other), (ref, *want)):
        assert torch.isfinite(a).all(), f"{n} not finite"
        # a gradient that is exactly 0 (q, k with one key: a softmax over one key is constant) is compared in
        # units of the output's norm
        scale = c.double().norm() if c.double().norm() > 0 else ref.double().norm()
        errs[n] = tuple(((x.double() - c.double()).norm() / scale).item() for x in (a, b))
    record("accuracy", name, dtype=str(dtype), errors={n: dict(triton=e[0], sdpa=e[1]) for n, e in errs.items()})
    tol = HALF_TOL[dtype]
    for n, (e_triton, e_sdpa) in errs.items():
        assert e_triton <= tol, f"{n}: rel err {e_triton:.2e} > {tol:.0e} (sdpa backend {e_sdpa:.2e})"
        assert e_triton <= 2 * e_sdpa + 1e-3, f"{n}: rel err {e_triton:.2e} vs sdpa backend {e_sdpa:.2e}"


def _gpu_case(case: str, d: int, dtype: torch.dtype):
    """(inputs, keyword arguments) of one named case at head width d, value width 2d."""
    g = torch.Generator().manual_seed(11)
    if case == "n1":  # one query, one key
        return make_inputs(B=2, H=2, Nq=1, d=d, dtype=dtype), dict(lambda_=0.8)
    if case == "decode":  # one new query against a cache of 300 keys
        return make_inputs(B=2, H=2, Nq=1, Nk=300, d=d, dtype=dtype), dict(lambda_=0.8, is_causal=True)
    if case == "causal_2048":
        return make_inputs(B=1, H=2, Nq=2048, d=d, dtype=dtype), dict(lambda_=0.8, is_causal=True)
    if case == "padded_300":  # bool key padding, per-head λ with a gradient
        mask = torch.ones(2, 1, 1, 300, dtype=torch.bool, device=DEVICE)
        mask[0, ..., 211:] = False
        lam = (0.2 + 0.6 * torch.rand(1, 2, 1, 1, generator=g)).to(DEVICE).requires_grad_()
        return make_inputs(B=2, H=2, Nq=300, d=d, dtype=dtype), dict(lambda_=lam, attn_mask=mask)
    if case == "gqa_gate_300":  # 4 query heads on 2 kv heads, causal, per-token λ and w1 (M-DGSA gate)
        gate = torch.rand(1, 4, 300, 1, generator=g).to(DEVICE).requires_grad_()
        lam = (1.0 - torch.rand(1, 4, 300, 1, generator=g)).to(DEVICE).requires_grad_()
        return (make_inputs(B=1, H=4, Hkv=2, Nq=300, d=d, dtype=dtype),
                dict(lambda_=lam, weight1=gate, is_causal=True))
    raise ValueError(case)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", ["n1", "decode", "causal_2048", "padded_300", "gqa_gate_300"])
def test_half_precision_against_reference_and_sdpa(case, d, dtype):
    qkv, kw = _gpu_case(case, d, dtype)
    compare_with_reference_and_sdpa(f"{case}_d{d}_{str(dtype)[6:]}", qkv, **kw)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_bf16_long_sequence_against_fp32_sdpa(d, causal):
    """N = 16384 in bf16 against the ``sdpa`` backend on the same inputs upcast to float32 (a float64 N×N
    reference would need tens of GiB): output and every gradient within 2e-2."""
    from diffattn.functional import diff_attention

    qkv = make_inputs(B=1, H=1, Nq=16384, d=d, dtype=torch.bfloat16)
    up = [t.detach().float().requires_grad_() for t in qkv]
    out = diff_attention(*qkv, 0.8, is_causal=causal, backend="triton")
    ref = diff_attention(*up, 0.8, is_causal=causal, backend="sdpa")
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    got = torch.autograd.grad(out, qkv, grad_out)
    want = torch.autograd.grad(ref, up, grad_out.float())
    errs = {n: rel_err(a, b) for n, a, b in zip(["out", "q1", "k1", "q2", "k2", "v"], (out, *got), (ref, *want))}
    record("accuracy", f"n16384_d{d}_{'causal' if causal else 'full'}_bf16", dtype="torch.bfloat16",
            errors={n: dict(triton=e) for n, e in errs.items()})
    for n, e in errs.items():
        assert e <= 2e-2, f"{n}: rel err {e:.2e}"


@pytest.mark.gpu
@needs_cuda
def test_auto_backend_runs_the_kernel_on_cuda(monkeypatch):
    """backend="auto" on CUDA runs the fused kernel when it applies (the same result, bit for bit)."""
    from diffattn.functional import diff_attention

    calls = []
    real = triton_diff._fwd_impl
    monkeypatch.setattr(triton_diff, "_fwd_impl", lambda *a, **k: calls.append(1) or real(*a, **k))
    qkv = [t.detach() for t in make_inputs(B=2, H=4, Hkv=2, Nq=130, d=64, dtype=torch.bfloat16)]
    a = diff_attention(*qkv, 0.8, is_causal=True)
    assert calls, "backend='auto' did not run the fused kernel on CUDA"
    b = diff_attention(*qkv, 0.8, is_causal=True, backend="triton")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
@needs_cuda
def test_auto_backend_leaves_wide_values_at_long_lengths_to_sdpa(monkeypatch):
    """At value width 256 the fused kernel is slower than the sdpa backend from 2048 keys on (measured), so
    ``auto`` takes the kernel below that length and sdpa from it."""
    from diffattn.functional import diff_attention

    calls = []
    real = triton_diff._fwd_impl
    monkeypatch.setattr(triton_diff, "_fwd_impl", lambda *a, **k: calls.append(1) or real(*a, **k))
    for n, kernel in ((1024, True), (2048, False)):
        calls.clear()
        qkv = [t.detach() for t in make_inputs(B=1, H=2, Nq=n, d=128, dtype=torch.bfloat16)]
        diff_attention(*qkv, 0.8)
        assert bool(calls) == kernel, n


@pytest.mark.gpu
@needs_cuda
def test_layer_compiles_with_inductor_on_cuda():
    """A DiffAttention layer under torch.compile(fullgraph=True) with the default (inductor) backend and bf16
    autocast: one graph, the fused kernel inside it, output and input gradient as in eager within bf16 rounding."""
    from diffattn import DiffAttention

    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = DiffAttention(256, 8, causal=True).to(DEVICE)
    x = torch.randn(2, 300, 256, device=DEVICE, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, ref = compiled(x), layer(x)
    assert rel_err(out, ref) <= 1e-2
    g = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, x, g)
    (rx,) = torch.autograd.grad(ref, x, g)
    assert rel_err(gx, rx) <= 2e-2
    torch._dynamo.reset()


@pytest.mark.gpu
@needs_cuda
def test_functional_triton_backend_matches_sdpa():
    from diffattn.functional import diff_attention

    qkv = [t.detach() for t in make_inputs(B=2, H=4, Hkv=2, Nq=130, d=64, dtype=torch.bfloat16)]
    a = diff_attention(*qkv, 0.8, is_causal=True, backend="triton")
    b = diff_attention(*qkv, 0.8, is_causal=True, backend="sdpa")
    assert rel_err(a, b) <= 2e-2


def test_eager_and_compiled_paths_match_and_constants_survive_inference_mode():
    """Eager calls run an autograd.Function around the launchers and compiled ones the operators: same output and
    gradients. A float weight becomes a cached device constant; one first made under inference mode must still be
    savable for backward afterwards."""
    torch._dynamo.reset()
    triton_diff._CONSTANTS.clear()
    qkv, lam = _op_args()
    with torch.inference_mode():
        triton_diff_attention(*[t.detach() for t in qkv], 0.8, weight1=0.5)
    eager = triton_diff_attention(*qkv, lam, weight1=0.5, is_causal=True)
    compiled = torch.compile(lambda *a: triton_diff_attention(*a, weight1=0.5, is_causal=True), fullgraph=True,
                             backend="aot_eager")(*qkv, lam)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    g = torch.randn_like(eager)
    for a, b in zip(torch.autograd.grad(eager, [*qkv, lam], g), torch.autograd.grad(compiled, [*qkv, lam], g)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    out = triton_diff_attention(*qkv, 0.8, weight1=0.5)  # the cached constants, saved for backward
    out.sum().backward()
    torch._dynamo.reset()


# --------------------------------------------------------------------------- one differential layer, fused


def layer_reference(q, k, v, mode, lam_inputs, lam_init, norm_weight, norm_scale, eps, k_paired, attn_mask=None,
                    is_causal=False):
    """s · RMSNorm(w1 ⊙ A1 V − λ ⊙ A2 V) ⊙ w in float64 from the layer's interleaved head pairs, with w1 and λ made
    from their sources as the λ forms make them (Ye et al. 2024 eq. 2; M-DGSA; Ye et al. 2026)."""
    q, k, v = q.double(), k.double(), v.double()
    q1, q2 = q[:, 0::2], q[:, 1::2]
    k1, k2 = (k[:, 0::2], k[:, 1::2]) if k_paired else (k, k)
    if mode == "reparam":
        lq1, lk1, lq2, lk2 = (t.double() for t in lam_inputs)
        w1, lam = 1.0, torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + lam_init
    else:
        g = torch.sigmoid(lam_inputs[0].double()).transpose(1, 2).unsqueeze(-1)  # (B, H, N, 1)
        w1, lam = (g, 1.0 - g) if mode == "gate" else (1.0, g)
    o = reference(q1, k1, q2, k2, v, lam, w1, attn_mask, is_causal)
    if norm_scale is None:
        return o
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
    return o * (norm_weight.double() * norm_scale if norm_weight is not None else norm_scale)


def _layer_inputs(mode, k_paired, B=2, H=2, Hkv=2, N=37, d=16, affine=True, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(DEVICE).requires_grad_()

    dv = 2 * d if k_paired else d
    q = rnd(B, 2 * H, N, d)
    k = rnd(B, 2 * Hkv if k_paired else Hkv, N, d)
    v = rnd(B, Hkv, N, dv)
    lam_inputs = tuple(rnd(d, s=0.3) for _ in range(4)) if mode == "reparam" else (rnd(B, N, H),)
    nw = (torch.rand(dv, generator=g) + 0.5).to(DEVICE).requires_grad_() if affine else None
    return q, k, v, lam_inputs, nw


@pytest.mark.parametrize("mode", ["reparam", "gate", "sigmoid"])
@pytest.mark.parametrize("k_paired,Hkv", [(True, 2), (True, 1), (False, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_layer_matches_float64_reference(mode, k_paired, Hkv, causal):
    """Output and every gradient (q, k, v, the λ sources, the sub-norm weight) of the fused layer path."""
    q, k, v, lam_inputs, nw = _layer_inputs(mode, k_paired, Hkv=Hkv)
    kw = dict(k_paired=k_paired, lambda_mode=mode, lambda_inputs=lam_inputs, lambda_init=0.3,
              norm_width=v.shape[-1], norm_weight=nw, norm_scale=0.7, norm_eps=1e-5, is_causal=causal)
    assert triton_diff.fused_layer_reason(q, k, v, k_paired=k_paired, lambda_mode=mode, lambda_inputs=lam_inputs,
                                          norm_weight=nw, norm_width=v.shape[-1], attn_mask=None,
                                          is_causal=causal) is None
    out = triton_diff.fused_layer_attention(q, k, v, **kw)
    ref = layer_reference(q, k, v, mode, lam_inputs, 0.3, nw, 0.7, 1e-5, k_paired, is_causal=causal)
    assert out.shape == ref.shape and out.transpose(1, 2).is_contiguous()  # stored as (B, N, H, dv)
    assert rel_err(out, ref) <= 1e-5
    leaves = [q, k, v, *lam_inputs, nw]
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    got = torch.autograd.grad(out, leaves, grad_out)
    want = torch.autograd.grad(ref, leaves, grad_out.double())
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and a.dtype == leaves[i].dtype
        assert rel_err(a, b) <= 1e-5, f"input {i}: rel err {rel_err(a, b):.2e}"


@pytest.mark.parametrize("affine,norm", [(False, True), (False, False)])
def test_fused_layer_without_affine_or_norm_and_with_key_padding(affine, norm):
    q, k, v, lam_inputs, nw = _layer_inputs("gate", True, N=29, affine=affine)
    mask = torch.ones(2, 1, 1, 29, dtype=torch.bool, device=DEVICE)
    mask[1, ..., 20:] = False
    out = triton_diff.fused_layer_attention(q, k, v, k_paired=True, lambda_mode="gate", lambda_inputs=lam_inputs,
                                            norm_width=v.shape[-1] if norm else None, norm_weight=nw,
                                            norm_scale=0.5, attn_mask=mask)
    ref = layer_reference(q, k, v, "gate", lam_inputs, 0.0, nw, 0.5 if norm else None, 1e-5, True, attn_mask=mask)
    assert rel_err(out, ref) <= 1e-5
    leaves = [q, k, v, lam_inputs[0]]
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out)
    for a, b in zip(torch.autograd.grad(out, leaves, g), torch.autograd.grad(ref, leaves, g.double())):
        assert rel_err(a, b) <= 1e-5


def test_fused_layer_frozen_sources_and_inference():
    """Frozen λ sources get no gradient and leave the other inputs untouched; without grad only the output is
    computed (the same numbers), and its backward is refused with the reason."""
    q, k, v, (z,), nw = _layer_inputs("sigmoid", False)
    z = z.detach()
    q_before = q.detach().clone()
    kw = dict(k_paired=False, lambda_mode="sigmoid", lambda_inputs=(z,), norm_width=v.shape[-1], norm_weight=nw)
    out = triton_diff.fused_layer_attention(q, k, v, **kw)
    gq, gv = torch.autograd.grad(out, [q, v], torch.ones_like(out))
    assert torch.equal(q.detach(), q_before) and torch.isfinite(gq).all() and torch.isfinite(gv).all()
    with torch.no_grad():
        again = triton_diff.fused_layer_attention(q, k, v, **kw)
    torch.testing.assert_close(again, out.detach(), rtol=0, atol=0)


def test_fused_layer_reasons():
    q, k, v, lam_inputs, nw = _layer_inputs("reparam", True)
    kw = dict(k_paired=True, lambda_mode="reparam", norm_weight=nw, norm_width=v.shape[-1], attn_mask=None,
              is_causal=False)
    per_head = tuple(t.detach().expand(2, -1) for t in lam_inputs)
    assert "four vectors" in triton_diff.fused_layer_reason(q, k, v, lambda_inputs=per_head, **kw)
    assert "lambda_mode" in triton_diff.fused_layer_reason(q, k, v, lambda_inputs=lam_inputs,
                                                           **{**kw, "lambda_mode": "other"})
    assert "width" in triton_diff.fused_layer_reason(q, k, v, lambda_inputs=lam_inputs,
                                                     **{**kw, "norm_width": 7, "norm_weight": None})
    assert "logits of shape" in triton_diff.fused_layer_reason(q, k, v, lambda_inputs=(q,),
                                                               **{**kw, "lambda_mode": "gate"})


@pytest.mark.parametrize("kind,options", [("diff", {}), ("diff", {"num_kv_heads": 2, "causal": True}),
                                          ("diff", {"sub_norm": False}), ("gated", {"q_residual": True}),
                                          ("diff_v2", {"num_kv_heads": 2, "causal": True}),
                                          ("diff", {"lambda_options": {"per_head": True}})])
def test_layers_take_the_fused_path_with_the_same_numbers(kind, options, monkeypatch):
    """DiffAttention, GatedDiffAttention and DiffAttentionV2 hand λ, the combination and the sub-norm to the
    kernels when the operator would run them (here forced on the CPU interpreter): output and every parameter
    gradient as the ``sdpa`` backend gives them. A λ form the kernels do not compute (one λ per head) keeps the
    general path."""
    import copy

    import diffattn.ops.functional as functional
    from diffattn.layers.attention import attention_class

    torch.manual_seed(0)
    layer = attention_class(kind)(64, 4, backend="triton", **options).to(DEVICE)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ref = copy.deepcopy(layer)
    ref.backend = "sdpa"
    calls = []
    real = triton_diff.fused_layer_attention
    monkeypatch.setattr(functional, "_triton_reason", lambda *a: None)
    monkeypatch.setattr(triton_diff, "fused_layer_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(2, 24, 64, device=DEVICE)
    outs, grads = [], []
    for m in (layer, ref):
        xi = x.clone().requires_grad_()
        y = m(xi)
        outs.append(y)
        grads.append(torch.autograd.grad(y, [xi, *m.parameters()], torch.ones_like(y) + 0.1 * x.sum(-1, True)))
    assert len(calls) == (0 if "lambda_options" in options else 1)
    assert rel_err(outs[0], outs[1]) <= 1e-5
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    scale = max(g.abs().max().item() for g in grads[1])
    for name, a, b in zip(names, *grads):
        assert (a - b).abs().max().item() <= 1e-5 * scale, name


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kind", ["diff", "gated", "diff_v2"])
def test_layers_fused_path_bf16_autocast(kind):
    """On a GPU under bf16 autocast (fp32 λ vectors and norm weight, bf16 activations) the fused layer path gives
    the ``sdpa`` backend's output and input gradient to bf16 accuracy."""
    import copy

    from diffattn.layers.attention import attention_class

    torch.manual_seed(0)
    layer = attention_class(kind)(512, 8, backend="auto", causal=True).cuda()
    ref = copy.deepcopy(layer)
    ref.backend = "sdpa"
    x = torch.randn(2, 300, 512, device="cuda")
    outs, grads = [], []
    for m in (layer, ref):
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        outs.append(y.float())
        grads.append(torch.autograd.grad(y.float().square().sum(), [xi, *m.parameters()]))
    assert rel_err(outs[0], outs[1]) <= 2e-2
    assert rel_err(grads[0][0], grads[1][0]) <= 5e-2  # x
    names = [n for n, _ in layer.named_parameters()]
    for name, a, b in zip(names, grads[0][1:], grads[1][1:]):  # k_proj.bias: exactly 0 in exact arithmetic
        assert (a - b).norm() <= 5e-2 * b.norm() + 1e-3 * grads[1][0].norm(), name


@pytest.mark.gpu
@needs_cuda
def test_choose_backend_on_the_gpu():
    from diffattn.functional import choose_backend

    q, k = torch.randn(1, 4, 256, 64, device="cuda"), torch.randn(1, 4, 256, 64, device="cuda")
    c = choose_backend(q, k, q, k, torch.randn(1, 4, 256, 128, device="cuda"))
    assert c.backend == "triton" and "fused kernel" in c.reason
    q, k = torch.randn(1, 2, 4096, 128, device="cuda"), torch.randn(1, 2, 4096, 128, device="cuda")
    c = choose_backend(q, k, q, k, torch.randn(1, 2, 4096, 256, device="cuda"))
    assert c.backend == "sdpa" and "from 2048 keys on" in c.reason


@pytest.mark.parametrize("causal", [False, True])
def test_split_dkdv_backward_matches_reference(causal):
    """The dK/dV backward as two launches (dV, then dK1 and dK2) gives the same gradients, for the operator and for
    the fused layer path (shared K of Diff Transformer V2 included)."""
    qkv = make_inputs(B=2, H=2, Hkv=1, Nq=37, d=16)
    with triton_diff.split_dkdv(16, 32):
        assert triton_diff._split_dkdv(16, 32)
        check(qkv, 0.7, weight1=0.9, is_causal=causal)
    assert not triton_diff._split_dkdv(16, 32)
    q, k, v, lam_inputs, nw = _layer_inputs("sigmoid", False, Hkv=1)
    kw = dict(k_paired=False, lambda_mode="sigmoid", lambda_inputs=lam_inputs, norm_width=v.shape[-1],
              norm_weight=nw, norm_scale=0.5, is_causal=causal)
    out = triton_diff.fused_layer_attention(q, k, v, **kw)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out)
    whole = torch.autograd.grad(out, [q, k, v, *lam_inputs, nw], g)
    with triton_diff.split_dkdv(16, 16):
        out = triton_diff.fused_layer_attention(q, k, v, **kw)
        split = torch.autograd.grad(out, [q, k, v, *lam_inputs, nw], g)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
