"""capture_attention: maps that reproduce each layer's output, model outputs unchanged, λ and gate per head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffattn.diagnostics import attention_modules, capture_attention
from diffattn.layers import ATTENTION_TYPES, Attention, DiffAttention, GatedDiffAttention
from diffattn.models import create_model


def _out_proj_input(layer, x):
    seen = {}

    def grab(module, args, output):  # returns None: the output is left alone
        seen["x"] = args[0].detach()

    h = layer.out_proj.register_forward_hook(grab)
    try:
        with capture_attention(layer) as cap:
            y = layer(x)
    finally:
        h.remove()
    return y, seen["x"], cap.layers


def _heads_v(layer, x, heads):
    B, N, _ = x.shape
    return layer.v_proj(x).view(B, N, heads, -1).transpose(1, 2)  # (B, H, N, dv)


@pytest.mark.parametrize("causal", [False, True])
def test_standard_maps_times_v_is_layer_output(causal):
    layer = Attention(32, 4, causal=causal).eval()
    x = torch.randn(2, 7, 32)
    ref = layer(x)
    y, o_in, layers = _out_proj_input(layer, x)
    assert torch.equal(y, ref)  # output unchanged, bit for bit (the maps are computed on the side)
    (m,) = layers
    assert m.kind == "standard" and m.second is None and m.lambda_ is None
    torch.testing.assert_close(m.first, m.combined)
    v = _heads_v(layer, x, 4)
    o = (m.combined.double() @ v.double()).transpose(1, 2).reshape(2, 7, 32)
    torch.testing.assert_close(o, o_in.double(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(m.first.sum(-1), torch.ones(2, 4, 7))
    if causal:
        assert float(m.first.triu(1).abs().max()) == 0.0


def test_diff_maps_times_v_is_layer_output_and_lambda_per_head():
    layer = DiffAttention(32, 4, sub_norm=False).eval()  # no sub-norm: out_proj sees (A1 − λA2) V directly
    x = torch.randn(2, 6, 32)
    ref = layer(x)
    y, o_in, (m,) = _out_proj_input(layer, x)
    assert torch.equal(y, ref)
    assert m.kind == "diff" and m.first.shape == (2, 2, 6, 6) and m.lambda_.shape == (2,)
    lam = float(m.lambda_[0])
    # independent float64 reference of A1, A2 from the layer's projections
    q = layer.q_proj(x).view(2, 6, 4, 8).transpose(1, 2).double()
    k = layer.k_proj(x).view(2, 6, 4, 8).transpose(1, 2).double()
    a1 = torch.softmax(q[:, 0::2] @ k[:, 0::2].transpose(-1, -2) / 8**0.5, -1)
    a2 = torch.softmax(q[:, 1::2] @ k[:, 1::2].transpose(-1, -2) / 8**0.5, -1)
    torch.testing.assert_close(m.first.double(), a1, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(m.second.double(), a2, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(m.combined.double(), a1 - lam * a2, atol=1e-6, rtol=1e-5)
    o = (m.combined.double() @ _heads_v(layer, x, 2).double()).transpose(1, 2).reshape(2, 6, 32)
    torch.testing.assert_close(o, o_in.double(), atol=1e-6, rtol=1e-5)


def test_gated_maps_times_v_matches_after_sub_norm_and_gate_is_captured():
    layer = GatedDiffAttention(32, 4).eval()
    x = torch.randn(2, 5, 32)
    ref = layer(x)
    y, o_in, (m,) = _out_proj_input(layer, x)
    assert torch.equal(y, ref)
    assert m.kind == "gated" and m.gate.shape == (2, 2, 5, 1)
    g = torch.sigmoid(layer.gate_proj(x)).transpose(1, 2).unsqueeze(-1)
    torch.testing.assert_close(m.gate, g.detach())
    torch.testing.assert_close(m.combined, g.detach() * m.first - (1 - g.detach()) * m.second, atol=1e-6, rtol=1e-5)
    # the layer applies (1 − λ_init)·RMSNorm((gA1 − (1 − g)A2) V) with a unit norm weight at init
    o = m.combined @ _heads_v(layer, x, 2)
    o = F.rms_norm(o, (o.shape[-1],), eps=1e-5) * (1 - layer.lambda_init)
    torch.testing.assert_close(o.transpose(1, 2).reshape(2, 5, 32), o_in, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["lm_tiny", "diff_lm_tiny", "dg_lm_tiny"])
def test_causal_lm_outputs_unchanged_and_every_block_captured(name):
    model = create_model(name, vocab_size=64, dim=32, depth=2, num_heads=4).eval()
    ids = torch.randint(0, 64, (2, 9))
    ref = model(ids)
    with capture_attention(model) as cap:
        out = model(ids)
    assert torch.equal(out, ref)
    assert len(cap.layers) == 2 and [m.name for m in cap.layers] == [n for n, _, _ in attention_modules(model)]
    for m in cap.layers:
        assert float(m.combined.triu(1).abs().max()) == 0.0  # causal
    assert not model.blocks[0].attn._forward_hooks  # hooks removed on exit


def test_vit_caller_asking_weights_still_gets_them():
    model = create_model("diff_vit_nano", img_size=8, patch_size=2, in_chans=1, num_classes=3, depth=2).eval()
    x = torch.randn(1, 1, 8, 8)
    ref = model.attention_maps(x)
    with capture_attention(model) as cap:
        got = model.attention_maps(x)
    assert len(got) == 2 and len(cap.layers) == 2
    torch.testing.assert_close(got[1].combined, ref[1].combined)
    torch.testing.assert_close(cap.layers[1].combined, ref[1].combined.float())


def test_capture_rejects_models_without_attention():
    with pytest.raises(ValueError, match="no attention module"):
        with capture_attention(torch.nn.Linear(2, 2)):
            pass
    with pytest.raises(ValueError, match="names must be attention modules"):
        with capture_attention(Attention(8, 2), names=["nope"]):
            pass


def test_retrofitted_hf_model_combined_maps():
    T = pytest.importorskip("transformers")
    import diffattn

    cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32, bos_token_id=0,
                       eos_token_id=0)
    model = T.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").eval()
    diffattn.retrofit(model, "daa", lambda_init=0.5)
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        ref = model(ids).logits
        with capture_attention(model) as cap:
            out = model(ids).logits
    assert torch.equal(out, ref)
    assert len(cap.layers) == 2 and all(m.kind == "retrofit" for m in cap.layers)
    for m in cap.layers:  # rows of A1 − λA2 sum to 1 − λ
        lam = float(m.lambda_.mean())
        torch.testing.assert_close(m.combined.sum(-1), torch.full_like(m.combined.sum(-1), 1 - lam), atol=1e-5,
                                   rtol=1e-5)


@pytest.fixture
def two_threads():
    """Two torch threads: the SDPA kernels then split their sums in another order than the ``math`` backend."""
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("kind", sorted(ATTENTION_TYPES))
def test_capture_leaves_every_kind_bit_for_bit_with_two_threads(kind, training, two_threads):
    """The outputs and gradients with and without the capture are equal bit for bit (two runs in this process), in
    training too (attention dropout: the maps on the side draw no random numbers); the maps are the attention
    distributions, rows summing to 1."""
    layer = ATTENTION_TYPES[kind](64, 4, attn_drop=0.1 if training else 0.0).train(training)
    x = torch.randn(2, 64, 64, requires_grad=True)  # 64 tokens: SDPA and math differ in the last bit here
    torch.manual_seed(1)
    ref = layer(x)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), x)
    torch.manual_seed(1)
    with capture_attention(layer) as cap:
        out = layer(x)
    (g,) = torch.autograd.grad(out.square().sum(), x)
    assert torch.equal(out, ref) and torch.equal(g, g_ref)
    (m,) = cap.layers
    torch.testing.assert_close(m.first.sum(-1), torch.ones_like(m.first.sum(-1)))


def test_capture_leaves_a_retrofit_bit_for_bit_with_two_threads(two_threads):
    """A retrofit keeps its maps on the side: the logits with and without the capture are equal bit for bit."""
    T = pytest.importorskip("transformers")
    import diffattn

    cfg = T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=64, n_positions=64, bos_token_id=0,
                       eos_token_id=0)
    model = T.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").eval()
    diffattn.retrofit(model, "daa", lambda_init=0.5)
    ids = torch.randint(0, 64, (2, 64))
    with torch.no_grad():
        ref = model(ids).logits
        with capture_attention(model) as cap:
            out = model(ids).logits
    assert torch.equal(out, ref) and len(cap.layers) == 2
