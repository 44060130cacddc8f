"""Attention layers against float64 references of their equations; KV cache; RoPE; errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from diffattn import Attention, DiffAttention, GatedDiffAttention, KVCache
from diffattn.layers import ATTENTION_TYPES, DiffAttentionV2, RMSNorm, SwiGLU, attention_class, attention_kind

from .reference import F64, TOLERANCES, ref_softmax_rows, rms_norm, rope_tables, rotate


def lin(m: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = x @ m.weight.detach().to(F64).T
    return y if m.bias is None else y + m.bias.detach().to(F64)


def allowed_mask(B, nq, nk, keep=None, causal=False):
    ok = torch.ones(B, nq, nk, dtype=torch.bool)
    if keep is not None:
        ok &= keep[:, None, :]
    if causal:
        ok &= torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
    return ok


def ref_layer(m, x, keep=None, causal=False, rope=None):
    """Ye et al. 2024 §2.1 / M-DGSA (2025) Alg. 1, head by head in float64, from the raw weights."""
    x = x.to(F64)
    B, N, D = x.shape
    h, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    q = lin(m.q_proj, x).view(B, N, h, d)
    k = lin(m.k_proj, x).view(B, N, hkv, d)
    if rope is not None:
        cos, sin = rope_tables(N, d, style=rope)
        q = rotate(q.transpose(1, 2), cos, sin, rope).transpose(1, 2)
        k = rotate(k.transpose(1, 2), cos, sin, rope).transpose(1, 2)
    ok = allowed_mask(B, N, N, keep, causal)
    scale = 1 / math.sqrt(d)
    heads = []
    if isinstance(m, Attention):
        v = lin(m.v_proj, x).view(B, N, hkv, d)
        for i in range(h):
            j = i // (h // hkv)
            a = ref_softmax_rows(q[:, :, i] @ k[:, :, j].transpose(1, 2) * scale, ok)
            heads.append(a @ v[:, :, j])
        return lin(m.out_proj, torch.cat(heads, -1))
    H, Hkv = h // 2, hkv // 2
    v = lin(m.v_proj, x).view(B, N, Hkv, 2 * d)
    lam_init = m.lambda_init
    if isinstance(m, GatedDiffAttention):
        g = torch.sigmoid(lin(m.gate_proj, x))  # (B, N, H)
    else:
        lq1, lk1, lq2, lk2 = (p.detach().to(F64) for p in (m.lambda_q1, m.lambda_k1, m.lambda_q2, m.lambda_k2))
        lam = torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + lam_init
    for i in range(H):
        j = i // (H // Hkv)
        a1 = ref_softmax_rows(q[:, :, 2 * i] @ k[:, :, 2 * j].transpose(1, 2) * scale, ok)
        a2 = ref_softmax_rows(q[:, :, 2 * i + 1] @ k[:, :, 2 * j + 1].transpose(1, 2) * scale, ok)
        if isinstance(m, GatedDiffAttention):
            gi = g[:, :, i:i + 1]
            o = (gi * a1 - (1 - gi) * a2) @ v[:, :, j]
        else:
            o = (a1 - lam * a2) @ v[:, :, j]
        heads.append(rms_norm(o, m.diff_norm.weight.detach(), 1e-5) * (1 - lam_init))
    out = lin(m.out_proj, torch.cat(heads, -1))
    if isinstance(m, GatedDiffAttention) and m.q_residual:
        out = out + lin(m.q_proj, x)
    return out


def randomize(m):
    """Non-trivial norm weights and gate biases so the reference checks them too."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name or "gate" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return m


#: the settings a kind needs to be built with 4 heads (gdla's default noise heads, num_heads / 5, need 5k heads)
FOUR_HEADS = {"gdla": {"num_noise_heads": 1}}

LAYERS = [
    (Attention, {}),
    (DiffAttention, {}),
    (DiffAttention, {"lambda_init": "ye", "depth": 3}),
    (GatedDiffAttention, {}),
    (GatedDiffAttention, {"q_residual": True}),
]


@pytest.mark.parametrize("cls,kw", LAYERS)
@pytest.mark.parametrize("num_kv_heads", [None, 2])
@pytest.mark.parametrize("causal,padded", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("rope", [None, "half"])
def test_layer_matches_float64_reference(cls, kw, num_kv_heads, causal, padded, rope):
    torch.manual_seed(0)
    B, N, D, h = 2, 9, 32, 4
    m = randomize(cls(D, h, num_kv_heads=num_kv_heads, causal=causal, rope=rope, **kw)).double()
    x = torch.randn(B, N, D, dtype=F64)
    keep = None
    mask = None
    if padded:
        keep = torch.ones(B, N, dtype=torch.bool)
        keep[0, 6:] = False
        mask = keep[:, None, None, :]
    out = m(x, attn_mask=mask)
    ref = ref_layer(m, x, keep, causal, rope)
    assert out.shape == (B, N, D)
    assert (out - ref).abs().max().item() < 1e-10


def test_interleaved_rope_reference():
    m = DiffAttention(32, 4, rope="interleaved", causal=True).double()
    x = torch.randn(1, 7, 32, dtype=F64)
    assert (m(x) - ref_layer(m, x, causal=True, rope="interleaved")).abs().max().item() < 1e-10


@pytest.mark.parametrize("cls", [Attention, DiffAttention, GatedDiffAttention])
def test_backends_agree_in_the_layer(cls):
    torch.manual_seed(0)
    x = torch.randn(2, 20, 64)
    outs = []
    for backend in ("math", "sdpa", "auto"):
        torch.manual_seed(1)
        m = cls(64, 8, backend=backend, causal=True)
        outs.append(m(x))
    for o in outs[1:]:
        assert ((o - outs[0]).norm() / outs[0].norm()).item() < 1e-5


@pytest.mark.parametrize("cls", [Attention, DiffAttention, GatedDiffAttention])
@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_layer_traces_and_exports_for_deployment(cls, num_kv_heads):
    """torch.jit.trace (TorchScript, what Ultralytics' export uses) and torch.export of the fused-kernel path give
    the eager output; the trace also for another batch and length than it saw. The head counts reach SDPA as
    Python values: under the tracer they used to be tensors, and ``enable_gqa`` refused them."""
    import warnings

    torch.manual_seed(0)
    m = cls(64, 8, num_kv_heads=num_kv_heads, backend="sdpa").eval()
    x, y = torch.randn(2, 10, 64), torch.randn(3, 7, 64)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarning on the head-count ints, which are constants of the layer
        traced = torch.jit.trace(m, x)
        exported = torch.export.export(m, (x,)).module()
        for t in (x, y):  # the trace also runs another batch size and length than it saw
            torch.testing.assert_close(traced(t), m(t), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(exported(x), m(x), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cls", [Attention, DiffAttention, GatedDiffAttention])
def test_layer_compiles_as_one_graph(cls):
    """torch.compile(fullgraph=True) captures the layer without a graph break (forward and backward), with the
    eager output; the dynamo front end alone (backend "eager"), so the test needs no C++ compiler."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = cls(64, 8, num_kv_heads=4, causal=True)
    x = torch.randn(2, 12, 64, requires_grad=True)
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    out = compiled(x)
    torch.testing.assert_close(out, m(x))
    out.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    torch._dynamo.reset()


@pytest.mark.parametrize("cls", [Attention, DiffAttention, GatedDiffAttention])
@pytest.mark.parametrize("num_kv_heads", [None, 4])
def test_layer_exports_to_onnx_and_runs_in_onnxruntime(cls, num_kv_heads, tmp_path):
    """torch.onnx.export (the TorchScript-based exporter: it has no aten::rms_norm, so the differential layers'
    RMSNorm is written out while exporting) gives a program whose output in onnxruntime is the eager layer's,
    for another batch and length than the one exported too (dynamic axes). That exporter has no SDPA with
    ``enable_gqa`` either, so grouped K/V are repeated while exporting."""
    import warnings

    ort = pytest.importorskip("onnxruntime", reason="ONNX export needs the extra diffattn[export]")
    torch.manual_seed(0)
    m = cls(64, 8, num_kv_heads=num_kv_heads, backend="sdpa").eval()
    x, y = torch.randn(2, 10, 64), torch.randn(3, 7, 64)
    path = tmp_path / "layer.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        # inside a model, as layers are exported (the TorchScript exporter passes every forward parameter of the
        # top module positionally, which keyword-only parameters refuse)
        torch.onnx.export(nn.Sequential(m), (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch", 1: "tokens"}, "y": {0: "batch", 1: "tokens"}})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for t in (x, y):
        got = torch.from_numpy(session.run(None, {"x": t.numpy()})[0])
        torch.testing.assert_close(got, m(t).detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cls", [Attention, DiffAttention, GatedDiffAttention])
def test_layer_gradcheck(cls):
    torch.manual_seed(0)
    m = cls(8, 2, causal=True, rope="half").double()
    x = torch.randn(1, 4, 8, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: m(x), (x,))
    # gradients of the λ vectors / gate too
    params = [p for p in m.parameters() if p.requires_grad]
    out = m(x).pow(2).sum()
    grads = torch.autograd.grad(out, params)
    assert all(torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum().item() > 0 for g in grads) == len(grads)


@pytest.mark.parametrize("cls", [Attention, DiffAttention, GatedDiffAttention])
@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_kv_cache_decoding_equals_full_forward(cls, num_kv_heads):
    torch.manual_seed(0)
    m = cls(32, 4, num_kv_heads=num_kv_heads, causal=True, rope="half").eval()
    x = torch.randn(2, 11, 32)
    full = m(x)
    cache = KVCache()
    steps = [m(x[:, :5], kv_cache=cache)]  # prefill
    for t in range(5, 11):
        steps.append(m(x[:, t:t + 1], kv_cache=cache))
    assert cache.length == 11
    inc = torch.cat(steps, 1)
    assert (inc - full).abs().max().item() < 1e-5


def test_need_weights_returns_both_maps_and_combined():
    m = DiffAttention(32, 4, causal=True)
    x = torch.randn(2, 6, 32)
    out, w = m(x, need_weights=True)
    assert torch.allclose(out, m(x), atol=1e-6)
    assert w.first.shape == w.second.shape == w.combined.shape == (2, 2, 6, 6)
    lam = m.lambda_weights(x)[1]
    assert torch.allclose(w.combined, w.first - lam * w.second, atol=1e-6)
    out, w = Attention(32, 4)(x, need_weights=True)
    assert w.second is None and w.first.shape == (2, 4, 6, 6)


def test_gated_layer_gate_is_per_token_and_head():
    m = GatedDiffAttention(32, 4)
    g = m.gate(torch.randn(3, 7, 32))
    assert g.shape == (3, 2, 7, 1) and ((g > 0) & (g < 1)).all()
    assert m.gate_proj.out_features == 2 and m.lambda_form == "gate"


def test_state_dict_names_and_parameter_count_follow_diffclip():
    D, h = 64, 8
    d = D // h
    std = sum(p.numel() for p in Attention(D, h).parameters())
    diff = DiffAttention(D, h)
    names = set(diff.state_dict())
    assert {"q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "lambda_q1", "lambda_k1",
            "lambda_q2", "lambda_k2", "diff_norm.weight"} <= names
    assert sum(p.numel() for p in diff.parameters()) == std + 4 * d + 2 * d
    gated = GatedDiffAttention(D, h)
    assert sum(p.numel() for p in gated.parameters()) == std + 2 * d + D * (h // 2) + h // 2


def test_other_lambda_forms_run():
    x = torch.randn(2, 5, 32)
    for form in ("dual_scalar", "constant", "annealed", "token_sigmoid", "gate"):
        m = DiffAttention(32, 4, lambda_form=form)
        assert m(x).shape == x.shape
    assert isinstance(DiffAttention(32, 4, lambda_form="token_sigmoid", sub_norm=False).diff_norm, torch.nn.Identity)


@pytest.mark.parametrize("options,sub_norm", [({}, None), ({"bias": True}, None), ({}, True)])
def test_token_sigmoid_is_the_diff_transformer_v2_form(options, sub_norm):
    """λ = σ(X W) per token and head, no sub-norm by default (Ye et al. 2026, Diff Transformer V2); ``bias=True``
    gives σ(X W + b) (diffattn 0.1.0); ``sub_norm=True`` adds RMSNorm × (1 − λ_init)."""
    torch.manual_seed(0)
    B, N, D, h = 2, 7, 32, 4
    kw = {} if sub_norm is None else {"sub_norm": sub_norm}
    m = randomize(DiffAttention(D, h, lambda_form="token_sigmoid", lambda_options=options, **kw)).double()
    proj = m.lambda_fn.lambda_proj
    assert (proj.bias is not None) == bool(options) and isinstance(m.diff_norm, nn.Identity) == (not sub_norm)
    assert m.out_scale == (1 - m.lambda_init if sub_norm else 1.0)
    if proj.bias is not None:
        with torch.no_grad():
            proj.bias.normal_()
    x = torch.randn(B, N, D, dtype=F64)
    d, H = m.head_dim, h // 2
    q, k = lin(m.q_proj, x).view(B, N, h, d), lin(m.k_proj, x).view(B, N, h, d)
    v = lin(m.v_proj, x).view(B, N, H, 2 * d)
    lam = torch.sigmoid(lin(proj, x))  # (B, N, H)
    ok = allowed_mask(B, N, N)
    heads = []
    for i in range(H):
        a1 = ref_softmax_rows(q[:, :, 2 * i] @ k[:, :, 2 * i].transpose(1, 2) / math.sqrt(d), ok)
        a2 = ref_softmax_rows(q[:, :, 2 * i + 1] @ k[:, :, 2 * i + 1].transpose(1, 2) / math.sqrt(d), ok)
        o = a1 @ v[:, :, i] - lam[:, :, i:i + 1] * (a2 @ v[:, :, i])
        heads.append(rms_norm(o, m.diff_norm.weight.detach(), 1e-5) * (1 - m.lambda_init) if sub_norm else o)
    ref = lin(m.out_proj, torch.cat(heads, -1))
    torch.testing.assert_close(m(x), ref, **TOLERANCES[F64])


def test_attention_class_switch():
    assert attention_class("diff") is DiffAttention
    with pytest.raises(ValueError, match="attention"):
        attention_class("linear")


def test_attention_kind_is_the_registered_name_of_the_nearest_class():
    class Mine(DiffAttentionV2):  # an unregistered subclass takes its parent's kind
        pass

    assert {attention_kind(cls(32, 4, **FOUR_HEADS.get(kind, {}))) for kind, cls in ATTENTION_TYPES.items()} == set(
        ATTENTION_TYPES)
    assert attention_kind(GatedDiffAttention(32, 4)) == "gated"  # a subclass of DiffAttention, registered itself
    assert attention_kind(Mine(32, 4)) == "diff_v2"
    assert attention_kind(torch.nn.Linear(2, 2)) is None and attention_kind(torch.nn.MultiheadAttention(8, 2)) is None


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(dim=32, num_heads=3), "even|divisible"),
        (dict(dim=30, num_heads=4), "divisible"),
        (dict(dim=32, num_heads=4, num_kv_heads=3), "num_kv_heads|divisible"),
        (dict(dim=32, num_heads=8, num_kv_heads=1), "num_kv_heads"),
        (dict(dim=32, num_heads=4, lambda_form="nope"), "lambda_form"),
        (dict(dim=32, num_heads=4, lambda_options={"nope": 1}), "lambda_options"),
        (dict(dim=32, num_heads=4, lambda_init=float("nan")), "lambda_init"),
        (dict(dim=32, num_heads=4, lambda_init=float("inf")), "lambda_init"),
        (dict(dim=32, num_heads=4, sub_norm_eps=0.0), "sub_norm_eps"),
        (dict(dim=32, num_heads=4, lambda_init="schedule"), "lambda_init"),
        (dict(dim=32, num_heads=4, backend="xla"), "backend"),
        (dict(dim=32, num_heads=4, rope="alibi"), "rope"),
        (dict(dim=32, num_heads=4, attn_drop=1.5), "attn_drop"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DiffAttention(**kwargs)


def test_bad_forward_input():
    m = DiffAttention(32, 4)
    with pytest.raises(ValueError, match="x must have shape"):
        m(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match="attn_mask"):
        m(torch.randn(2, 5, 32), attn_mask=torch.ones(2, 4, 5, 5, dtype=torch.bool))  # 4 heads, layer has 2


def test_swiglu_formula():
    m = SwiGLU(8, 12).double()
    x = torch.randn(3, 8, dtype=F64)
    g = lin(m.gate_proj, x)
    ref = lin(m.down_proj, g * torch.sigmoid(g) * lin(m.up_proj, x))
    assert torch.allclose(m(x), ref, atol=1e-12)


# ------------------------------------------------------------------------------------- Diff Transformer V2


@pytest.mark.parametrize("h,hkv", [(4, 4), (4, 2), (4, 1), (3, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_diff_v2_matches_reference_forward_and_backward(h, hkv, causal):
    from diffattn import DiffAttentionV2

    from .reference import ref_diff_v2

    D = 8 * h
    m = DiffAttentionV2(D, h, num_kv_heads=hkv, causal=causal).double()
    randomize(m)
    assert attention_class("diff_v2") is DiffAttentionV2
    assert m.q_proj.out_features == 2 * D and m.k_proj.out_features == hkv * 8 and m.out_proj.in_features == D
    assert m.lambda_fn.lambda_proj.bias is None and isinstance(m.diff_norm, torch.nn.Identity)
    x = torch.randn(2, 7, D, dtype=F64)
    keep = torch.ones(2, 7, dtype=torch.bool)
    keep[1, 5:] = False
    mask = keep[:, None, None, :]
    x_ref = x.clone().requires_grad_(True)
    ws = [p.detach().clone().requires_grad_(True) for p in (m.q_proj.weight, m.k_proj.weight, m.v_proj.weight,
                                                            m.lambda_fn.lambda_proj.weight, m.out_proj.weight)]
    ref = ref_diff_v2(x_ref, *ws, h, hkv, bq=m.q_proj.bias.detach(), bk=m.k_proj.bias.detach(),
                      bv=m.v_proj.bias.detach(), bo=m.out_proj.bias.detach(),
                      allowed=allowed_mask(2, 7, 7, keep), causal=causal)
    xx = x.clone().requires_grad_(True)
    out = m(xx, attn_mask=mask)
    torch.testing.assert_close(out, ref, **TOLERANCES[F64])
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(g)
    torch.testing.assert_close(xx.grad, x_ref.grad, **TOLERANCES[F64])
    for p, w in zip((m.q_proj.weight, m.k_proj.weight, m.v_proj.weight, m.lambda_fn.lambda_proj.weight,
                     m.out_proj.weight), ws):
        torch.testing.assert_close(p.grad, w.grad, **TOLERANCES[F64])


def test_diff_v2_float32_and_maps():
    from diffattn import DiffAttentionV2

    m = DiffAttentionV2(32, 4, num_kv_heads=2, causal=True)
    x = torch.randn(2, 6, 32)
    out, maps = m(x, need_weights=True)
    ref = m.double()(x.double())
    torch.testing.assert_close(out.double(), ref, **TOLERANCES[torch.float32])
    assert maps.first.shape == (2, 4, 6, 6)


# ------------------------------------------------------------------------ λ submodule, names, reliability


def test_lambda_form_is_a_submodule_and_checkpoint_names_are_kept():
    diff, gated = DiffAttention(32, 4), GatedDiffAttention(32, 4)
    assert isinstance(diff.lambda_fn, torch.nn.Module) and diff.lambda_q1 is diff.lambda_fn.lambda_q1
    assert gated.gate_proj is gated.lambda_fn.gate_proj
    sd = diff.state_dict()
    assert {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"} <= set(sd) and not any("lambda_fn" in k for k in sd)
    assert {"gate_proj.weight", "gate_proj.bias"} <= set(gated.state_dict())
    x = torch.randn(2, 5, 32)
    for m, cls in ((diff, DiffAttention), (gated, GatedDiffAttention)):
        fresh = cls(32, 4)
        fresh.load_state_dict(m.state_dict())  # strict
        torch.testing.assert_close(fresh(x), m(x), rtol=0, atol=0)
    sd = diff.state_dict()
    del sd["lambda_k2"]
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*\"lambda_k2\""):
        DiffAttention(32, 4).load_state_dict(sd)
    nested = torch.nn.Sequential(DiffAttention(32, 4))
    assert "0.lambda_q1" in nested.state_dict()
    missing = nested.load_state_dict({k: v for k, v in nested.state_dict().items() if k != "0.lambda_q1"},
                                     strict=False).missing_keys
    assert missing == ["0.lambda_q1"]


def test_sub_norm_arguments_and_lambda_options():
    m = DiffAttention(32, 4, sub_norm_eps=1e-6, sub_norm_affine=False)
    assert m.diff_norm.eps == 1e-6 and not m.diff_norm.elementwise_affine
    m = DiffAttention(32, 4, sub_norm=False).double()
    x = torch.randn(2, 5, 32, dtype=F64)
    lam = m.lambda_weights(x)[1]
    o = m(x)  # no norm, no (1 − λ_init) scale
    assert m.out_scale == 1.0 and isinstance(m.diff_norm, torch.nn.Identity) and torch.isfinite(o).all()
    m = DiffAttention(32, 4, lambda_options={"per_head": True})
    assert m.lambda_weights(x.float())[1].shape == (1, 2, 1, 1) and torch.isfinite(lam).all()
    g = GatedDiffAttention(32, 4, gate_bias=False)
    assert g.gate_proj.bias is None and "gate_proj.bias" not in g.state_dict()


@pytest.mark.parametrize("sub_norm", [True, False])
def test_output_scale_decoupled_from_the_sub_norm(sub_norm):
    """output_scale="tied" multiplies the heads' output by (1 − λ_init), "fixed" by 1, with or without the sub-norm
    (Ye et al. 2024, §2.1 put the scale after the sub-norm); with out_proj linear (no bias) the two outputs are
    (1 − λ_init) apart, and against a float64 reference of the heads' output."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32, dtype=F64)
    outs = {}
    for scale in ("tied", "fixed"):
        torch.manual_seed(1)
        m = DiffAttention(32, 4, lambda_init=0.3, sub_norm=sub_norm, output_scale=scale, out_bias=False).double()
        outs[scale] = m(x)
        assert m.out_scale == (0.7 if scale == "tied" else 1.0)
    assert torch.allclose(outs["tied"], 0.7 * outs["fixed"], atol=1e-13, rtol=0)
    assert not torch.allclose(outs["tied"], outs["fixed"], atol=1e-3)  # the scale is applied: the test can fail
    # the default keeps the paper's coupling: tied with the sub-norm, none without
    assert DiffAttention(32, 4, lambda_init=0.3, sub_norm=sub_norm).out_scale == (0.7 if sub_norm else 1.0)
    # float64 reference of the fixed-scale heads: RMSNorm((A1 − λ A2) V) per differential head, out_proj
    q = m.q_proj(x).view(2, 5, 4, 8).transpose(1, 2)  # (B, 2H, N, d)
    k = m.k_proj(x).view(2, 5, 4, 8).transpose(1, 2)
    v = m.v_proj(x).view(2, 5, 2, 16).transpose(1, 2)  # (B, H, N, 2d)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    a = ref_softmax_rows(scores, torch.ones_like(scores, dtype=torch.bool))  # (B, 2H, N, N)
    lam = float(m.lambda_weights(x)[1].detach())
    o = (a[:, 0::2] - lam * a[:, 1::2]) @ v  # (B, H, N, 2d)
    if sub_norm:
        o = rms_norm(o, m.diff_norm.weight, m.diff_norm.eps)
    ref = m.out_proj(o.transpose(1, 2).reshape(2, 5, 32))
    assert torch.allclose(outs["fixed"], ref, **TOLERANCES[F64])
    with pytest.raises(ValueError, match="attention output_scale must be one of"):
        DiffAttention(32, 4, output_scale="half")
    if sub_norm:  # a converter to a format that always scales refuses a fixed scale, naming it
        from diffattn.convert._common import check_convertible

        with pytest.raises(ValueError, match="output_scale='fixed'.*DiffLlama always scales"):
            check_convertible(DiffAttention(32, 4, output_scale="fixed"), "DiffLlama")


@pytest.mark.parametrize("cls", ["standard", "diff", "gated", "diff_v2"])
def test_layers_take_empty_batch_and_sequence(cls):
    m = attention_class(cls)(32, 4, causal=True, rope="half")
    for B, N in ((0, 5), (2, 0)):
        x = torch.randn(B, N, 32, requires_grad=True)
        out = m(x)
        assert out.shape == (B, N, 32)
        out.sum().backward()


@pytest.mark.parametrize("cls", ["standard", "diff", "gated", "diff_v2"])
def test_x_of_another_dtype_than_the_weights_is_a_clear_error(cls):
    m = attention_class(cls)(32, 4)
    with pytest.raises(ValueError, match="x has dtype torch.float64"):
        m(torch.randn(2, 5, 32, dtype=F64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(torch.randn(2, 5, 32).bfloat16()).shape == (2, 5, 32)


def test_float64_layer_with_float32_padding_mask():
    """A float32 additive mask on a float64 layer used to reach CPU SDPA unconverted (wrong once Nk ≥ 16)."""
    m = DiffAttention(32, 4).double()
    x = torch.randn(2, 20, 32, dtype=F64)
    keep = torch.ones(2, 20, dtype=torch.bool)
    keep[0, 14:] = False
    mask32 = torch.zeros(2, 1, 1, 20).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float32).min)
    torch.testing.assert_close(m(x, attn_mask=mask32), ref_layer(m, x, keep=keep), **TOLERANCES[F64])


def test_rms_norm_of_half_input_with_float_weight_takes_one_dtype():
    """Under autocast the sub-norm sees bf16 activations and its fp32 weight: the weight is cast to the input's
    dtype so that PyTorch's fused kernel runs (it refuses mixed dtypes and warns); output in the input's dtype,
    within bf16 rounding of the float64 reference, and the weight still gets its fp32 gradient."""
    import warnings

    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 16).to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Mismatch dtype ... Cannot dispatch to fused implementation"
        out = norm(x)
    assert out.dtype == torch.bfloat16
    ref = rms_norm(x.double(), norm.weight.detach().double(), 1e-5)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
    out.float().sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("kind", sorted(ATTENTION_TYPES))
def test_need_weights_leaves_the_output_bit_for_bit(kind, one_thread):
    """The maps are computed on the side: with two threads (where SDPA and math sum in another order) the output
    and its gradient equal those without need_weights bit for bit, and a KV cache is appended to once."""
    torch.set_num_threads(2)
    layer = attention_class(kind)(64, 4, causal=True, rope="half", **FOUR_HEADS.get(kind, {})).eval()
    x = torch.randn(2, 64, 64, requires_grad=True)
    ref = layer(x)
    out, maps = layer(x, need_weights=True)
    assert torch.equal(out, ref)
    g_ref, g = (torch.autograd.grad(y.square().sum(), x)[0] for y in (ref, out))
    assert torch.equal(g, g_ref)
    torch.testing.assert_close(maps.first.sum(-1), torch.ones_like(maps.first.sum(-1)))
    assert float(maps.first.detach().triu(1).abs().max()) == 0.0  # causal
    with torch.no_grad():
        plain, asked = KVCache(), KVCache()
        for part in (x[:, :60], x[:, 60:]):  # prefill, then 4 tokens against the cache
            y_ref = layer(part, kv_cache=plain)
            y, _ = layer(part, need_weights=True, kv_cache=asked)
            assert torch.equal(y, y_ref)
    assert plain.length == asked.length == 64
