"""capture_attention: maps that reproduce each layer's output, model outputs unchanged, λ and gate per head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffattn.diagnostics import attention_modules, capture_attention
from diffattn.layers import (
    ATTENTION_TYPES,
    Attention,
    DiffAttention,
    DiffAttentionV2,
    GatedDiffAttention,
    GroupedDiffAttention,
    GroupedLatentDiffAttention,
    StableAudioAttention,
    attention_kind,
)
from diffattn.models import create_model
from diffattn.models.motif import MOTIF_ATTENTION, MotifLM

from .reference import gdla_layer_heads, kind_head_pairs


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


#: every registered kind, built in float64 with 2 K/V heads (GQA); grouped: 8 query heads of width 8, 6 signal and
#: 2 noise heads, r = 3 signal heads per noise head (Motif Technologies 2025, arXiv 2510.06949); gdla (Motif-3) the
#: same 6 + 2 heads, query/key heads 4 + 4 wide (nope | rope), values 6 wide, one K/V head per group
KIND_LAYERS = {
    "standard": lambda **kw: Attention(32, 4, num_kv_heads=2, **kw),
    "diff": lambda **kw: DiffAttention(32, 4, num_kv_heads=2, **kw),
    "gated": lambda **kw: GatedDiffAttention(32, 4, num_kv_heads=2, **kw),
    "diff_v2": lambda **kw: DiffAttentionV2(32, 4, num_kv_heads=2, **kw),
    "grouped": lambda **kw: GroupedDiffAttention(32, 8, num_noise_heads=2, head_dim=8, num_kv_heads=4, **kw),
    # without its QK-norm and rotary embedding, so the maps from the raw projections are its maps
    "stable_audio": lambda **kw: StableAudioAttention(32, 4, num_kv_heads=2, qk_norm=False, rope=None, **kw),
    "gdla": lambda **kw: GroupedLatentDiffAttention(32, 8, num_noise_heads=2, num_kv_heads=2, q_lora_rank=16,
                                                    kv_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=4,
                                                    v_head_dim=6, **kw),
}
#: the settings a kind needs beyond (dim, 4 heads): gdla's default noise heads, num_heads / 5, need 5k heads
FOUR_HEADS = {"gdla": {"num_noise_heads": 1}}


def test_the_kinds_tested_are_the_registry():
    assert set(KIND_LAYERS) == set(ATTENTION_TYPES)
    assert all(attention_kind(make()) == kind and type(make()) is ATTENTION_TYPES[kind]
               for kind, make in KIND_LAYERS.items())


def _ref_maps(layer, kind, x):
    """A1 (or A) and A2 in float64 from the layer's projections, the head layout written out: standard one map per
    query head; diff / gated Q/K heads (2i, 2i+1); V2 query heads (2i, 2i+1) against one K head; grouped query
    heads in groups [signal × r, noise], signal keys K heads 2m, noise keys 2m + 1, one A2 per noise head. GQA:
    query head h reads K head h // (heads / K heads); gdla: its MLA heads [nope | rope] after RoPE in the grouped
    layout, each against its own K head (tests/reference.py). Causal."""
    B, N, _ = x.shape
    d = layer.head_dim
    if kind == "gdla":
        p = gdla_layer_heads(layer, x)
        q, k = p["q"], p["k"]
    else:
        q = layer.q_proj(x).view(B, N, -1, d).transpose(1, 2).double()
        k = layer.k_proj(x).view(B, N, -1, d).transpose(1, 2).double()
    pairs = kind_head_pairs(kind, q, k, getattr(layer, "num_noise_heads", None))
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    out = []
    for qq, kk in pairs:
        kk = kk.repeat_interleave(qq.shape[1] // kk.shape[1], dim=1)
        out.append(torch.softmax((qq @ kk.transpose(-2, -1) / d**0.5).masked_fill(~causal, float("-inf")), -1))
    return out


@pytest.mark.parametrize("kind,lambda_options", [(k, None) for k in KIND_LAYERS] + [
    ("diff", {"per_head": True}), ("grouped", {"per_head": True})],  # reparam λ per (noise) head
    ids=[*KIND_LAYERS, "diff-head_lambda", "grouped-head_lambda"])
def test_every_kind_maps_are_the_reference_and_combined_times_v_is_the_layer_output(kind, lambda_options):
    """For every kind: A1, A2 equal a float64 reference from the layer's weights; λ is the layer's, one per head of
    the combined map; combined = w1 ⊙ A1 − λ ⊙ A2 (a grouped signal head i with noise head i // r); and the
    combined map times V, through the layer's sub-norm and (1 − λ_init), is what out_proj receives, in float64.
    The maps are stored as float32 (2^-24 relative rounding), hence the 1e-6 tolerances."""
    torch.manual_seed(0)
    layer = KIND_LAYERS[kind](causal=True, **({} if lambda_options is None else {"lambda_options": lambda_options}))
    layer = layer.double().eval()
    with torch.no_grad():  # a λ away from its init, and a sub-norm weight that is not all ones
        for p in layer.lambda_fn.parameters() if hasattr(layer, "lambda_fn") else ():
            p.add_(0.3 * torch.randn_like(p))
        if isinstance(getattr(layer, "diff_norm", None), torch.nn.RMSNorm):
            layer.diff_norm.weight.add_(0.5 * torch.randn_like(layer.diff_norm.weight))
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    with torch.no_grad():
        ref = layer(x)
        y, o_in, layers = _out_proj_input(layer, x)
        maps = _ref_maps(layer, kind, x)
        w1, lam = layer.lambda_weights(x) if kind != "standard" else (1.0, None)
    assert (y - ref).abs().max().item() <= 1e-12  # the output is the layer's
    (m,) = layers
    assert m.kind == kind and m.name == ""
    assert (m.first.double() - maps[0]).abs().max().item() <= 1e-6
    heads = maps[0].shape[1]
    assert m.combined.shape == (2, heads, 6, 6)
    if kind == "standard":
        assert m.second is None and m.lambda_ is None and torch.equal(m.first, m.combined)
        a = maps[0]
    else:
        assert m.second.shape == maps[1].shape  # grouped: (B, H_n, N, N), one map per noise head
        assert (m.second.double() - maps[1]).abs().max().item() <= 1e-6
        r = heads // maps[1].shape[1]
        assert r == (3 if kind in ("grouped", "gdla") else 1)
        lam = torch.as_tensor(lam, dtype=torch.float64)
        lam = lam.expand(heads) if lam.dim() == 0 else lam.repeat_interleave(heads // lam.shape[-3], dim=-3)
        got_lam = m.lambda_.double()
        assert got_lam.shape[-3 if got_lam.dim() > 1 else 0] == heads
        assert (got_lam - lam.reshape(got_lam.shape)).abs().max().item() <= 1e-6
        lam = lam.reshape(heads, 1, 1) if lam.dim() == 1 else lam  # broadcast over (B, heads, Nq, Nk)
        a = w1 * maps[0] - lam * maps[1].repeat_interleave(r, dim=1)  # signal head i, noise head i // r
        assert (m.combined.double() - a).abs().max().item() <= 1e-6
        if kind == "gated":
            assert (m.gate.double() - w1).abs().max().item() <= 1e-6
    B, N, _ = x.shape
    if kind == "gdla":  # one K/V head per group: a signal head and its noise head share V; no sub-norm, a gate
        assert layer.shares_kv
        p = gdla_layer_heads(layer, x)
        v = p["v"].unflatten(1, (layer.num_noise_heads, -1))[:, :, :-1].flatten(1, 2)  # the signal heads' V
        o = (m.combined.double() @ v).transpose(1, 2).reshape(B, N, -1)
        o = o * torch.sigmoid(p["c_q"] @ layer.gate_proj.weight.T)
        assert (o - o_in).abs().max().item() <= 1e-5
        return
    v = layer.v_proj(x).view(B, N, layer.v_heads, -1).transpose(1, 2).double()
    o = m.combined.double() @ v.repeat_interleave(heads // v.shape[1], dim=1)  # (B, heads, N, dv)
    if kind != "standard":
        o = layer.diff_norm(o) * layer.out_scale
    assert (o.transpose(1, 2).reshape(B, N, -1) - o_in).abs().max().item() <= 1e-5


def test_grouped_noise_maps_per_signal_head_under_a_per_head_mask():
    """A mask that differs between the signal heads of a group makes their noise maps differ: A2 then holds the
    H_s maps the layer applied, and combined = A1 − λ A2 head by head."""
    torch.manual_seed(0)
    layer = KIND_LAYERS["grouped"]().double().eval()
    mask = torch.ones(1, 6, 5, 5, dtype=torch.bool)
    mask[:, 1, :, 0] = False  # signal head 1 does not see key 0; its group's other heads do
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    with torch.no_grad(), capture_attention(layer) as cap:
        layer(x, mask)
    (m,) = cap.layers
    assert m.second.shape == (1, 6, 5, 5) and float(m.second[0, 1, :, 0].abs().max()) == 0.0
    assert float(m.second[0, 0, :, 0].min()) > 0.0
    torch.testing.assert_close(m.combined, m.first - m.lambda_.reshape(1, 6, 1, 1) * m.second, atol=1e-6, rtol=0)


def test_motif_grouped_model_capture_every_layer():
    """A Motif-2-12.7B-layout MotifLM: every layer captured as grouped, A1 per signal head, A2 per noise head, the
    model's output unchanged and the rows of A1 − λA2 summing to 1 − λ."""
    torch.manual_seed(0)
    model = MotifLM(vocab_size=61, dim=40, depth=2, num_heads=10, mlp_hidden=48, attention={
        **MOTIF_ATTENTION, "kind": "grouped", "num_noise_heads": 2, "head_dim": 4, "num_kv_heads": 4}).eval()
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        ref = model(ids)
        with capture_attention(model) as cap:
            out = model(ids)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert [(m.name, m.kind) for m in cap.layers] == [("blocks.0.attn", "grouped"), ("blocks.1.attn", "grouped")]
    for m in cap.layers:
        assert m.first.shape == m.combined.shape == (2, 8, 7, 7) and m.second.shape == (2, 2, 7, 7)
        assert m.lambda_.shape == (8,)
        want = (1 - m.lambda_).reshape(1, 8, 1).expand(2, 8, 7)
        torch.testing.assert_close(m.combined.sum(-1), want, atol=1e-5, rtol=1e-5)


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
    layer = ATTENTION_TYPES[kind](64, 4, attn_drop=0.1 if training else 0.0, **FOUR_HEADS.get(kind, {}))
    layer = layer.train(training)
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
    """A retrofit keeps its maps on the side: the logits with and without the capture are equal bit for bit; the
    captured maps are the retrofit's, rows of A1 summing to 1."""
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
    assert torch.equal(out, ref)
    assert len(cap.layers) == 2 and all(m.kind == "retrofit" for m in cap.layers)
    for m in cap.layers:
        torch.testing.assert_close(m.first.sum(-1), torch.ones_like(m.first.sum(-1)))
