"""Property-based tests: the operator and the attention layers over random shapes, dtypes, masks, λ/weight shapes,
GQA ratios and backends. Every call must match the float64 reference (within ``TOLERANCES``) or raise a
ValueError/TypeError whose message names the argument at fault.

Outcomes are counted (clean / clear error / crash / NaN / silent wrong); the long profile prints them:
``pytest -m fuzz --hypothesis-profile=long tests/test_fuzz.py -s``.
"""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from diffattn.functional import attention, diff_attention
from diffattn.lambdas import available_lambdas
from diffattn.layers import attention_class

from .reference import F64, TOLERANCES, ref_diff_v2, reference
from .test_layers import ref_layer

pytestmark = pytest.mark.fuzz

OUTCOMES: Counter = Counter()  # read by tests/conftest.py at the end of the session
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


class Wrong(AssertionError):
    pass


def _record(outcome: str, detail: str) -> None:
    OUTCOMES[outcome] += 1
    if outcome not in ("clean", "clear error"):
        raise Wrong(f"{outcome}: {detail}")


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = TOLERANCES[dtype]
    scale = 1.0 if dtype != torch.bfloat16 else max(1.0, ref.abs().max().item() if ref.numel() else 1.0)
    return bool(((out.double() - ref).abs() <= tol["atol"] * scale + tol["rtol"] * ref.abs()).all())


def _judge(call, ref_fn, dtype, bad_name: str | None, finite_inputs: bool = True) -> None:
    """Run ``call``; classify its outcome against ``ref_fn`` (or the expected error naming ``bad_name``)."""
    try:
        out = call()
    except (ValueError, TypeError) as e:
        if bad_name is not None and bad_name in str(e):
            return _record("clear error", str(e))
        return _record("crash", f"unexpected {type(e).__name__}: {e} (expected error naming {bad_name!r})")
    except Exception as e:  # noqa: BLE001 - any other exception is a crash by definition
        return _record("crash", f"{type(e).__name__}: {e}")
    if bad_name is not None:
        return _record("wrong", f"invalid {bad_name} was accepted")
    if finite_inputs and not torch.isfinite(out).all():
        return _record("nan", "non-finite output from finite inputs")
    ref = ref_fn()
    if out.shape != ref.shape or not _close(out, ref, dtype):
        err = (out.double() - ref).abs().max().item() if out.shape == ref.shape and out.numel() else "shape"
        return _record("wrong", f"max error {err} for {dtype}")
    return _record("clean", "")


# ----------------------------------------------------------------------------------------------- operator


@st.composite
def operator_case(draw):
    dtype = draw(st.sampled_from(DTYPES))
    B = draw(st.integers(0, 2))
    hkv = draw(st.integers(1, 3))
    H = hkv * draw(st.integers(1, 3))
    nq, nk = draw(st.integers(0, 7)), draw(st.integers(0, 20))
    d, dv = draw(st.integers(1, 12)), draw(st.integers(1, 20))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=F64).to(dtype)

    q1, q2 = rnd(B, H, nq, d), rnd(B, H, nq, d)
    k1, k2, v = rnd(B, hkv, nk, d), rnd(B, hkv, nk, d), rnd(B, hkv, nk, dv)
    lam_kind = draw(st.sampled_from(["float", "np32", "0d", "head", "token"]))
    lam = {"float": 0.6, "np32": None, "0d": torch.tensor(0.3, dtype=dtype),
           "head": torch.rand(1, H, 1, 1, generator=g, dtype=F64).to(dtype),
           "token": torch.rand(B, H, nq, 1, generator=g, dtype=F64).to(dtype)}[lam_kind]
    if lam_kind == "np32":
        import numpy as np

        lam = np.float32(0.45)
    w1 = draw(st.sampled_from([None, "token"]))
    w1 = None if w1 is None else torch.rand(B, H, nq, 1, generator=g, dtype=F64).to(dtype)
    mask_kind = draw(st.sampled_from(["none", "bool", "bias", "neginf", "finfo_min", "all_masked"]))
    mask_shape = draw(st.sampled_from([(B, 1, 1, nk), (1, H, nq, nk), (nq, nk), (nk,), (B, H, nq, nk)]))
    allowed = torch.rand(mask_shape, generator=g) > 0.3
    mdtype = draw(st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]))
    if mask_kind == "none":
        mask, allowed, bias = None, None, None
    elif mask_kind in ("bool", "all_masked"):
        if mask_kind == "all_masked":
            allowed = allowed & False
        mask, bias = allowed, None
    else:
        fill = {"bias": None, "neginf": -math.inf, "finfo_min": torch.finfo(mdtype).min}[mask_kind]
        bias = torch.randn(mask_shape, generator=g, dtype=F64).to(mdtype)
        if fill is None:
            allowed = None
            mask = bias
        else:
            mask = bias.masked_fill(~allowed, fill)
            bias = bias.masked_fill(~allowed, 0.0)
    return dict(dtype=dtype, tensors=(q1, k1, q2, k2, v), lam=lam, w1=w1, mask=mask, allowed=allowed, bias=bias,
                is_causal=draw(st.booleans()), scale=draw(st.sampled_from([None, 0.5, 0.0, -0.3])),
                softcap=draw(st.sampled_from([None, None, 2.0])), backend=draw(st.sampled_from(["auto", "math",
                                                                                                "sdpa"])),
                corrupt=draw(st.sampled_from([None] * 14 + ["v_dtype", "mask_shape", "lam_shape", "heads", "dropout_p",
                                                           "mask_dtype", "scale"])),
                standard=draw(st.booleans()))


def _corrupt(case):
    """Make one argument invalid; returns the name the error must mention."""
    q1, k1, q2, k2, v = case["tensors"]
    kind = case["corrupt"]
    if kind == "v_dtype":
        other = torch.float16 if v.dtype != torch.float16 else torch.float32
        case["tensors"] = (q1, k1, q2, k2, v.to(other))
        return "dtype"
    if kind == "mask_shape":
        case["mask"] = torch.ones(3, 5, 7, 11, 13, dtype=torch.bool)
        return "attn_mask"
    if kind == "lam_shape":
        case["lam"] = torch.ones(q1.shape[1] + 1, 2, 2)
        case["standard"] = False
        return "lambda_"
    if kind == "heads":
        if q1.shape[1] % (k1.shape[1] + 1) == 0:
            return None
        k = torch.zeros(k1.shape[0], k1.shape[1] + 1, *k1.shape[2:], dtype=k1.dtype)
        vv = torch.zeros(v.shape[0], v.shape[1] + 1, *v.shape[2:], dtype=v.dtype)
        case["tensors"] = (q1, k, q2, k, vv)
        return "divisible"
    if kind == "dropout_p":
        case["dropout_p"] = 1.5
        return "dropout_p"
    if kind == "mask_dtype":
        case["mask"] = torch.ones(q1.shape[2], k1.shape[2], dtype=torch.int32)
        return "attn_mask"
    if kind == "scale":
        case["scale"] = math.nan
        return "scale"
    return None


@given(case=operator_case())
def test_operator_fuzz(case):
    bad = _corrupt(case)
    q1, k1, q2, k2, v = case["tensors"]
    dtype, backend, softcap = case["dtype"], case["backend"], case["softcap"]
    if bad is None and softcap is not None and backend == "sdpa":
        bad = "softcap"  # refused on purpose: the kernels do not soft-cap
    kw = dict(attn_mask=case["mask"], is_causal=case["is_causal"], scale=case["scale"], softcap=softcap,
              backend=backend, dropout_p=case.get("dropout_p", 0.0))
    if case["standard"]:
        _judge(lambda: attention(q1, k1, v, **kw),
               lambda: reference(q1, k1, q1, k1, v, 0.0, allowed=case["allowed"], bias=case["bias"],
                                 causal=case["is_causal"], scale=case["scale"], softcap=softcap), dtype, bad)
    else:
        lam = case["lam"]
        w1 = 1.0 if case["w1"] is None else case["w1"]
        _judge(lambda: diff_attention(q1, k1, q2, k2, v, lam, weight1=case["w1"], **kw),
               lambda: reference(q1, k1, q2, k2, v, float(lam) if not isinstance(lam, torch.Tensor) else lam, w1,
                                 allowed=case["allowed"], bias=case["bias"], causal=case["is_causal"],
                                 scale=case["scale"], softcap=softcap), dtype, bad)


# ------------------------------------------------------------------------------------------------ layers


@st.composite
def layer_case(draw):
    kind = draw(st.sampled_from(["standard", "diff", "gated", "diff_v2"]))
    paired = kind in ("diff", "gated")
    hkv = draw(st.integers(1, 2)) * (2 if paired else 1)
    h = hkv * draw(st.integers(1, 2))
    d = draw(st.sampled_from([2, 4, 8]))
    forms = [f for f in available_lambdas()]
    return dict(kind=kind, h=h, hkv=hkv, dim=h * d, dtype=draw(st.sampled_from(DTYPES)),
                B=draw(st.integers(0, 2)), N=draw(st.integers(0, 9)), causal=draw(st.booleans()),
                form=draw(st.sampled_from(forms)), sub_norm=draw(st.booleans()),
                rope=draw(st.sampled_from([None, "half", "interleaved"])),
                padding=draw(st.sampled_from(["none", "bool", "finfo_min"])),
                backend=draw(st.sampled_from(["auto", "math", "sdpa"])),
                seed=draw(st.integers(0, 2**31 - 1)),
                corrupt=draw(st.sampled_from([None] * 5 + ["lambda_init", "x_dtype", "x_shape"])))


@given(case=layer_case())
def test_layers_fuzz(case):
    torch.manual_seed(case["seed"])
    kind, dtype = case["kind"], case["dtype"]
    kw = dict(num_kv_heads=case["hkv"], causal=case["causal"], rope=case["rope"], backend=case["backend"])
    if kind != "standard":
        kw.update(lambda_form=case["form"], sub_norm=case["sub_norm"])
    bad = None
    if case["corrupt"] == "lambda_init" and kind != "standard":
        kw["lambda_init"], bad = math.inf, "lambda_init"
    try:
        layer = attention_class(kind)(case["dim"], case["h"], **kw)
    except (ValueError, TypeError) as e:
        return _record("clear error" if bad and bad in str(e) else "crash", str(e))
    except Exception as e:  # noqa: BLE001
        return _record("crash", f"{type(e).__name__}: {e}")
    if bad:
        return _record("wrong", "lambda_init=inf was accepted")
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    layer64 = copy.deepcopy(layer).double().eval()
    layer = layer.to(dtype).eval()
    B, N = case["B"], case["N"]
    x = torch.randn(B, N, case["dim"], dtype=F64)
    keep = torch.rand(B, N) > 0.3
    mask = None
    if case["padding"] == "bool":
        mask = keep[:, None, None, :]
    elif case["padding"] == "finfo_min":
        mask = torch.zeros(B, 1, 1, N).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float32).min)
    if case["padding"] == "none":
        keep = torch.ones(B, N, dtype=torch.bool)
    xin = x.to(dtype)
    if case["corrupt"] == "x_dtype":
        xin, bad = x.to(torch.float16), "x has dtype"
    elif case["corrupt"] == "x_shape":
        xin, bad = torch.randn(B, N, case["dim"] + 1).to(dtype), "x must have shape"

    def ref():
        independent = (kind == "standard" or (kind == "diff" and case["form"] == "reparam" and case["sub_norm"])
                       or (kind == "gated" and case["form"] == "gate" and case["sub_norm"]))
        if dtype == F64 and independent:
            return ref_layer(layer64, xin.double(), keep=keep, causal=case["causal"], rope=case["rope"])
        if dtype == F64 and kind == "diff_v2" and case["form"] == "token_sigmoid" and not case["sub_norm"] \
                and case["rope"] is None:
            m = layer64
            return ref_diff_v2(xin.double(), m.q_proj.weight, m.k_proj.weight, m.v_proj.weight,
                               m.lambda_fn.lambda_proj.weight, m.out_proj.weight, case["h"], case["hkv"],
                               bq=m.q_proj.bias, bk=m.k_proj.bias, bv=m.v_proj.bias, bo=m.out_proj.bias,
                               allowed=keep[:, None, :].expand(B, N, N).clone(), causal=case["causal"]).detach()
        with torch.no_grad():  # other dtypes: the float64 layer, itself checked against the references above
            return layer64(xin.double(), attn_mask=mask)

    with torch.no_grad():
        _judge(lambda: layer(xin, attn_mask=mask), ref, dtype, bad)
