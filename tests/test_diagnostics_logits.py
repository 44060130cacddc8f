"""Attention logits, hidden states and quantised logits: captured logits equal a float64 reference from the layer's
weights, outputs are unchanged, absmax quantisation follows its formula, the statistics are the ones by hand."""

from __future__ import annotations

import pytest
import torch

from diffattn import ops
from diffattn.diagnostics import (
    capture_attention,
    capture_hidden_states,
    capture_logits,
    hidden_stats,
    logit_layers,
    logit_stats,
    quantize_absmax,
    quantized_logits,
)
from diffattn.layers import (
    ATTENTION_TYPES,
    Attention,
    DiffAttention,
    DiffAttentionV2,
    GatedDiffAttention,
    GroupedDiffAttention,
    GroupedLatentDiffAttention,
    StableAudioAttention,
    apply_rotary,
)
from diffattn.models import CausalLM
from diffattn.models.motif import MOTIF_ATTENTION, MotifLM

from .reference import gdla_layer_heads, kind_head_pairs

KINDS = {"standard": Attention, "diff": DiffAttention, "gated": GatedDiffAttention, "diff_v2": DiffAttentionV2,
         "grouped": GroupedDiffAttention, "stable_audio": StableAudioAttention, "gdla": GroupedLatentDiffAttention}
#: a grouped layer of 8 query heads of width 8: 6 signal heads, 2 noise heads, r = 3 signal heads per noise head
GROUPED = dict(num_noise_heads=2, head_dim=8)
#: a GDLA layer of 8 query heads, 6 signal and 2 noise (r = 3), query/key heads 4 + 4 wide (nope | rope), values 6
#: wide; with 4 K/V heads (_layer) a group's signal and noise heads read different K/V heads (two operator calls)
GDLA = dict(num_noise_heads=2, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6)
#: the heads of each map of a CausalLM of 4 heads from _lm: standard A; diff / gated A1, A2; V2 2h query heads;
#: grouped (1 noise head, width 8) and gdla (1 noise head) 3 signal maps and 1 noise map; stable_audio two maps per
#: head
LM_HEADS = {"standard": (4,), "diff": (2, 2), "gated": (2, 2), "diff_v2": (4, 4), "grouped": (3, 1),
            "stable_audio": (4, 4), "gdla": (3, 1)}


def test_the_kinds_tested_are_the_registry():
    assert KINDS == ATTENTION_TYPES and set(LM_HEADS) == set(ATTENTION_TYPES)


def _layer(kind: str, *, causal: bool, rope: str | None, num_kv_heads: int | None = None):
    torch.manual_seed(0)
    heads, extra = {"grouped": (8, GROUPED), "gdla": (8, GDLA)}.get(kind, (4, {}))
    if kind == "gdla":  # it always rotates its rope channels: the other RoPE style stands in for "no RoPE"
        rope = rope or "interleaved"
    layer = KINDS[kind](32, heads, causal=causal, rope=rope, num_kv_heads=num_kv_heads, **extra).double().eval()
    with torch.no_grad():  # larger logits than the default init, so quantisation has something to round
        _q_weight(layer, kind).mul_(4.0)
    return layer


def _q_weight(layer, kind: str) -> torch.Tensor:
    """The weight the queries are linear in (gdla: the up-projection after its query latent's RMSNorm)."""
    return layer.q_b_proj.weight if kind == "gdla" else layer.q_proj.weight


def _ref_logits(layer, kind: str, x: torch.Tensor) -> list[torch.Tensor]:
    """S = Q Kᵀ / √d per map in float64 from the layer's projections and rotary module, the pairing written out:
    standard one map per head; diff / gated Q/K heads (2i, 2i+1); V2 query heads (2i, 2i+1) against one K head;
    grouped: query heads in groups [signal × r, noise], signal keys K heads 2m, noise keys 2m + 1, one A2 per noise
    head (Motif Technologies 2025, arXiv 2510.06949); gdla: the MLA heads [nope | rope] after RoPE in the same
    groups, query head h against K/V head h // (H / H_kv), s = 1/√(d_nope + d_rope) (tests/reference.py)."""
    if kind == "gdla":
        p = gdla_layer_heads(layer, x)
        d = layer.qk_nope_head_dim + layer.qk_rope_head_dim
        return [qq @ kk.transpose(-2, -1) / d**0.5 for qq, kk in kind_head_pairs(kind, p["q"], p["k"],
                                                                                  layer.num_noise_heads)]
    B, N, _ = x.shape
    d = layer.head_dim
    q = layer.q_proj(x).view(B, N, -1, d).transpose(1, 2)  # (B, q_heads, N, d)
    k = layer.k_proj(x).view(B, N, -1, d).transpose(1, 2)  # (B, kv_heads, N, d)
    if hasattr(layer, "q_norm"):  # Stable Audio 3's QK-norm
        q, k = layer.q_norm(q), layer.k_norm(k)
    if layer.rotary is not None:  # on the first r channels (r < d: Stable Audio 3's partial RoPE)
        r = layer.rotary.head_dim
        cos, sin = layer.rotary(torch.arange(N), dtype=torch.float64)
        q, k = (torch.cat([apply_rotary(t[..., :r], cos, sin, layer.rotary.style), t[..., r:]], -1) for t in (q, k))
    pairs = kind_head_pairs(kind, q, k, getattr(layer, "num_noise_heads", None))
    out = []
    for qq, kk in pairs:
        kk = kk.repeat_interleave(qq.shape[1] // kk.shape[1], dim=1)  # GQA: query head h reads key head h // G
        out.append(qq @ kk.transpose(-2, -1) / d**0.5)  # (B, H, N, N)
    return out


def _seen(B, N, causal, pad):
    """(B, 1, N, N) bool: causal and/or the padding of the last ``pad`` keys of batch element 1."""
    keep = torch.ones(B, 1, N, N, dtype=torch.bool)
    if causal:
        keep &= torch.ones(N, N, dtype=torch.bool).tril()
    if pad:
        keep[1, :, :, N - pad:] = False
    return keep


def _ref_output(layer, kind, x, maps):
    """The layer's output from the maps A (standard) or A1, A2 (differential), its own V, λ, norm and projection;
    gdla: A1 V of the signal head's K/V head − λ A2 V of its noise head's, times the gate σ(c_q W_gate)."""
    B, N, _ = x.shape
    if kind == "gdla":
        p = gdla_layer_heads(layer, x)
        v = p["v"].unflatten(1, (layer.num_noise_heads, -1))  # (B, H_n, r + 1, N, d_v)
        v1, v2 = v[:, :, :-1].flatten(1, 2), v[:, :, -1].repeat_interleave(layer.group_ratio, dim=1)
        _, lam = layer.lambda_weights(x)
        o = maps[0] @ v1 - lam * (maps[1].repeat_interleave(layer.group_ratio, dim=1) @ v2)
        o = o.transpose(1, 2).reshape(B, N, -1) * torch.sigmoid(p["c_q"] @ layer.gate_proj.weight.T)
        return layer.out_proj(o)
    v = layer.v_proj(x).view(B, N, layer.v_heads, layer.v_head_dim).transpose(1, 2)
    v = v.repeat_interleave(maps[0].shape[1] // v.shape[1], dim=1)
    if kind == "standard":
        o = maps[0] @ v
    else:
        w1, lam = layer.lambda_weights(x)
        a2 = maps[1].repeat_interleave(maps[0].shape[1] // maps[1].shape[1], dim=1)  # grouped: noise head i // r
        o = (w1 * maps[0] - lam * a2) @ v
        o = layer.diff_norm(o) * layer.out_scale
    return layer.out_proj(o.transpose(1, 2).reshape(B, N, -1))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rope", [None, "half"])
def test_captured_logits_are_the_reference_and_outputs_unchanged(kind, causal, rope):
    layer = _layer(kind, causal=causal, rope=rope, num_kv_heads={"diff_v2": 2, "gdla": 4}.get(kind))
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False  # the last two keys of batch element 1 are padding
    with torch.no_grad():
        ref_out = layer(x, mask)
        with capture_logits(layer) as cap:
            out = layer(x, mask)
        ref = _ref_logits(layer, kind, x)
    assert layer.backend == "auto" and ops.SCORE_HOOK.get() is None  # restored
    assert (out - ref_out).abs().max().item() <= 1e-12
    assert len(cap.layers) == 1
    entry = cap.layers[0]
    assert entry["name"] == "" and entry["kind"] == kind
    assert len(entry["logits"]) == (1 if kind == "standard" else 2)
    for got, want in zip(entry["logits"], ref):
        assert got.shape == want.shape and got.dtype == torch.float64
        assert (got - want).abs().max().item() <= 1e-12
    assert torch.equal(entry["mask"].expand(2, 1, 6, 6), _seen(2, 6, causal, 2))


def _lm(kind: str) -> CausalLM:
    extra = {"grouped": {"num_noise_heads": 1, "head_dim": 8}, "gdla": {"num_noise_heads": 1}}.get(kind, {})
    return CausalLM(vocab_size=50, dim=32, depth=2, num_heads=4, attention={"kind": kind, **extra}).eval()


def test_causal_lm_capture_float32_and_every_block():
    torch.manual_seed(0)
    for kind in KINDS:
        model = _lm(kind)
        ids = torch.randint(0, 50, (2, 9))
        with torch.no_grad():
            ref = model(ids)
            with capture_logits(model) as cap:
                out = model(ids)
        # capture_logits reads S inside the math backend, which sums in another order than the SDPA and fused
        # kernels of the plain forward: float32 reassociation, at most 9.4e-7 on logits of magnitude 0.5 (gated,
        # one or two threads), so 1e-5 leaves a tenfold margin on any CPU
        assert (out - ref).abs().max().item() <= 1e-5
        assert [e["name"] for e in cap.layers] == ["blocks.0.attn", "blocks.1.attn"]
        assert all(e["mask"].shape == (9, 9) and torch.equal(e["mask"], torch.ones(9, 9).tril().bool())
                   for e in cap.layers)
        assert all([s.shape for s in e["logits"]] == [(2, h, 9, 9) for h in LM_HEADS[kind]] for e in cap.layers)
        st = logit_stats(cap, per_map=True)
        assert st["count"] == 2 * 2 * sum(LM_HEADS[kind]) * 45  # layers × B × heads of the maps × causal of 9×9
        assert 0 < st["median"] <= st["top10"] <= st["top1"]
        assert set(st["per_map"]) == ({"A"} if kind == "standard" else {"A1", "A2"})
        assert max(s["top1"] for s in st["per_map"].values()) == st["top1"]


def test_motif_grouped_model_every_logit_diagnostic():
    """A Motif-2-12.7B-layout MotifLM (grouped differential attention: 8 signal and 2 noise heads of width 4, 4 K/V
    heads): logit_layers finds its layers, each A2 logit is recorded once per noise head and equals a float64
    reference from the layer's weights, the statistics count the maps the layer defines, the hidden states of every
    block are recorded, and 16-bit quantised logits leave the model's output within 1e-6."""
    torch.manual_seed(0)
    model = MotifLM(vocab_size=61, dim=40, depth=2, num_heads=10, mlp_hidden=48, attention={
        **MOTIF_ATTENTION, "kind": "grouped", "num_noise_heads": 2, "head_dim": 4, "num_kv_heads": 4}).double().eval()
    found = logit_layers(model)
    assert [(name, kind) for name, _, kind in found] == [("blocks.0.attn", "grouped"), ("blocks.1.attn", "grouped")]
    assert all(m is blk.attn for (_, m, _), blk in zip(found, model.blocks))
    inputs = []
    hooks = [blk.attn.register_forward_pre_hook(lambda mod, args: inputs.append(args[0])) for blk in model.blocks]
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        ref_out = model(ids)
        inputs.clear()
        with capture_logits(model) as cap, capture_hidden_states(model) as hs:
            out = model(ids)
        for h in hooks:
            h.remove()
        with quantized_logits(model, 16):
            q16 = model(ids)
        refs = [_ref_logits(blk.attn, "grouped", x) for blk, x in zip(model.blocks, inputs)]
    assert (out - ref_out).abs().max().item() <= 1e-12 and (q16 - ref_out).abs().max().item() <= 1e-6
    for entry, ref in zip(cap.layers, refs):
        assert entry["kind"] == "grouped" and [s.shape for s in entry["logits"]] == [(2, 8, 7, 7), (2, 2, 7, 7)]
        for got, want in zip(entry["logits"], ref):
            assert (got - want).abs().max().item() <= 1e-12
    st = logit_stats(cap, per_map=True)
    assert st["count"] == 2 * 2 * (8 + 2) * 28  # layers × B × (signal + noise heads) × causal entries of 7×7
    assert st["per_map"]["A2"]["count"] == 2 * 2 * 2 * 28
    assert [e["name"] for e in hs.states] == ["blocks.0", "blocks.1"] and hidden_stats(hs)["count"] == 2 * 2 * 7 * 40


def test_grouped_noise_logits_per_signal_head_under_a_per_head_mask():
    """A mask that differs between the signal heads of a group: the noise map differs per signal head, so all H_s
    copies of A2's logits are kept, each with the mask its signal head saw."""
    layer = _layer("grouped", causal=False, rope=None)
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    mask = torch.ones(1, 6, 5, 5, dtype=torch.bool)
    mask[:, 1, :, 0] = False  # signal head 1 (group 0) does not see key 0
    with torch.no_grad(), capture_logits(layer) as cap:
        layer(x, mask)
        a1, a2 = _ref_logits(layer, "grouped", x)
    got1, got2 = cap.layers[0]["logits"]
    assert got1.shape == got2.shape == (1, 6, 5, 5)
    assert (got2 - a2.repeat_interleave(3, dim=1)).abs().max().item() <= 1e-12
    assert torch.equal(cap.layers[0]["mask"], mask)
    assert logit_stats(cap)["count"] == 2 * (6 * 25 - 5)


def test_nested_contexts_capture_quantised_logits_and_unwind():
    layer = _layer("diff", causal=True, rope="half")
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    with torch.no_grad(), quantized_logits(layer, 4), capture_logits(layer) as cap:
        layer(x)
        ref = _ref_logits(layer, "diff", x)
    assert ops.SCORE_HOOK.get() is None and layer.backend == "auto"
    assert not layer._forward_hooks and not layer._forward_pre_hooks
    seen = _seen(2, 6, True, 0)
    for got, s in zip(cap.layers[0]["logits"], ref):
        q = quantize_absmax(s, seen, 4)
        assert (got - q).abs().max().item() <= 1e-12
        step = (s.abs().masked_fill(~seen, 0).amax((-2, -1), keepdim=True) / 7)  # Δ per (b, h)
        k = got / step
        assert (k - k.round()).abs().max().item() <= 1e-9  # every logit a multiple of Δ
        top = k.masked_fill(~seen, 0).abs().amax((-2, -1))  # the max maps to 2^(bits−1) − 1
        assert (top - 7).abs().max().item() <= 1e-9


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("causal", [False, True])
def test_quantized_maps_and_output_match_a_float64_reference(kind, causal):
    layer = _layer(kind, causal=causal, rope="half")
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    pad = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    pad[1, ..., 5:] = False
    seen = _seen(2, 7, causal, 2)
    with torch.no_grad():
        plain = layer(x, pad)
        with quantized_logits(layer, 4):
            out, w = layer(x, pad, need_weights=True)
        logits = _ref_logits(layer, kind, x)
        maps = []
        for s in logits:
            a = s.abs().masked_fill(~seen, 0).amax(dim=(-2, -1), keepdim=True)  # max|S| per (b, h) over seen
            delta = a / (2**3 - 1)
            sq = torch.round(s / delta) * delta
            maps.append(torch.softmax(sq.masked_fill(~seen, float("-inf")), dim=-1))
        ref = _ref_output(layer, kind, x, maps)
    got = [w.first] if kind == "standard" else [w.first, w.second]
    for g, m in zip(got, maps):  # the layer returns a grouped A2 per signal head, noise head i // r
        assert (g - m.repeat_interleave(g.shape[1] // m.shape[1], dim=1)).abs().max().item() <= 1e-5
    assert (out - ref).abs().max().item() <= 1e-5
    assert (out - plain).abs().max().item() > 1e-3  # 4 bits changes the output
    with torch.no_grad(), quantized_logits(layer, 16):
        out16 = layer(x, pad)
    assert (out16 - plain).abs().max().item() <= 1e-3
    assert layer.backend == "auto"


def test_quantized_causal_lm_16_bits_is_the_model_4_bits_is_not():
    torch.manual_seed(1)
    for kind in KINDS:
        model = _lm(kind)
        with torch.no_grad():
            for blk in model.blocks:
                _q_weight(blk.attn, kind).mul_(20.0)
            ids = torch.randint(0, 50, (2, 12))
            ref = model(ids)
            with quantized_logits(model, 16):
                q16 = model(ids)
            with quantized_logits(model, 4):
                q4 = model(ids)
            after = model(ids)
        assert (q16 - ref).abs().max().item() <= 1e-3
        assert (q4 - ref).abs().max().item() > 1e-4
        assert torch.equal(after, ref)


def test_quantize_absmax_by_hand():
    s = torch.tensor([[[[1.0, -3.5, 100.0], [0.4, 2.0, 0.0]]]])  # (1, 1, 2, 3)
    seen = torch.tensor([[True, True, False], [True, True, True]])  # 100 is masked: Δ = 3.5 / 7 = 0.5 at 4 bits
    q = quantize_absmax(s, seen, 4)
    assert q[0, 0, 0, :2].tolist() == [1.0, -3.5] and q[0, 0, 1].tolist() == [0.5, 2.0, 0.0]
    assert quantize_absmax(torch.zeros(1, 1, 2, 2), None, 3).abs().sum().item() == 0.0  # Δ = 0 keeps zeros
    q2 = quantize_absmax(s, None, 2)  # Δ = 100: everything below 50 rounds to 0
    assert q2.flatten().tolist() == [0.0, -0.0, 100.0, 0.0, 0.0, 0.0]


def test_logit_stats_by_hand():
    s1 = torch.arange(1.0, 17.0).view(1, 1, 4, 4) * torch.tensor([1.0, -1.0, 1.0, -1.0])  # |S| = 1 … 16
    s2 = torch.full((1, 1, 4, 4), 0.5)
    tril = torch.ones(4, 4, dtype=torch.bool).tril()  # seen |S1|: 1, 5, 6, 9, 10, 11, 13, 14, 15, 16
    layers = [{"name": "a", "kind": "diff", "logits": [s1, s2], "mask": tril}]
    st = logit_stats(layers, per_map=True)
    seen1 = sorted([1, 5, 6, 9, 10, 11, 13, 14, 15, 16] + [0.5] * 10, reverse=True)
    assert st["count"] == 20 and st["top1"] == 16.0
    assert st["top10"] == seen1[9] == 1.0
    assert st["median"] == (seen1[9] + seen1[10]) / 2 == 0.75
    assert st["per_map"]["A1"] == {"top1": 16.0, "top10": 1.0, "median": 10.5, "count": 10}
    assert st["per_map"]["A2"] == {"top1": 0.5, "top10": 0.5, "median": 0.5, "count": 10}
    # the masked 12, 8, 7, … are never counted, and the median of an odd count is the middle value
    one = logit_stats([{"name": "s", "kind": "standard", "logits": [s1], "mask": torch.eye(4, dtype=torch.bool)}])
    assert one == {"top1": 16.0, "top10": 1.0, "median": 8.5, "count": 4}  # |diag| = 1, 6, 11, 16
    three = logit_stats([{"name": "s", "kind": "standard", "logits": [s1[..., :3, :1]], "mask": None}])
    assert three["median"] == 5.0 and three["top10"] == 1.0  # 1, 5, 9; fewer than 10: the smallest


def test_hidden_states_every_block_and_stats_by_hand():
    torch.manual_seed(0)
    model = CausalLM(vocab_size=50, dim=16, depth=3, num_heads=2, attention="diff").eval()
    ids = torch.randint(0, 50, (2, 5))
    outs = []
    hooks = [b.register_forward_hook(lambda m, a, o: outs.append(o.detach())) for b in model.blocks]
    with torch.no_grad(), capture_hidden_states(model) as hs:
        ref = model(ids)
    for h in hooks:
        h.remove()
    assert [s["name"] for s in hs.states] == ["blocks.0", "blocks.1", "blocks.2"]
    assert all(torch.equal(s["hidden"], o) for s, o in zip(hs.states, outs))
    assert hs.states[0]["hidden"].shape == (2, 5, 16)
    with torch.no_grad():
        assert torch.equal(model(ids), ref)  # hooks removed, computation untouched
    assert not any(b._forward_hooks for b in model.blocks)
    allv = torch.cat([o.flatten() for o in outs]).abs().sort(descending=True).values
    st = hidden_stats(hs)
    assert st["count"] == 3 * 2 * 5 * 16 and st["top1"] == pytest.approx(allv[0].item(), abs=1e-7)
    assert st["top10"] == pytest.approx(allv[9].item(), abs=1e-7)
    assert st["median"] == pytest.approx((allv[239] + allv[240]).item() / 2, abs=1e-7)
    by_hand = hidden_stats([torch.tensor([[-4.0, 1.0], [2.0, -3.0]])])
    assert by_hand == {"top1": 4.0, "top10": 1.0, "median": 2.5, "count": 4}


def test_contexts_restore_on_exception():
    model = CausalLM(vocab_size=20, dim=16, depth=2, num_heads=2, attention="gated")
    layers = [m for _, m, _ in logit_layers(model)]
    with pytest.raises(RuntimeError, match="boom"), quantized_logits(model, 8):
        raise RuntimeError("boom")
    with pytest.raises(ValueError), capture_logits(model):
        model(torch.zeros(2, 3))  # float ids: the model raises ValueError inside the context
    assert all(m.backend == "auto" and not m._forward_hooks and not m._forward_pre_hooks for m in layers)
    assert ops.SCORE_HOOK.get() is None


def test_exception_inside_a_layer_resets_the_hook():
    layer = _layer("standard", causal=False, rope=None)
    with pytest.raises(ValueError, match="x must have shape"), capture_logits(layer):
        layer(torch.randn(1, 3, 31, dtype=torch.float64))
    assert ops.SCORE_HOOK.get() is None and layer.backend == "auto"


def test_bad_input():
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    for fn in (capture_logits, capture_hidden_states, lambda m: quantized_logits(m, 8)):
        with pytest.raises(ValueError, match="no diffattn attention layer"):
            fn(plain)
    layer = Attention(16, 2)
    with pytest.raises(ValueError, match="no block"):
        capture_hidden_states(layer)
    for bits in (1, 17, 4.0, True, "8", None):
        with pytest.raises(ValueError, match=rf"bits must be an integer in \[2, 16\], got {bits!r}"):
            quantized_logits(layer, bits)
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        capture_logits("model")
    with pytest.raises(ValueError, match="no entries"):
        logit_stats([])
    with pytest.raises(ValueError, match="capture_or_layers must be"):
        logit_stats([torch.zeros(2)])
    with pytest.raises(ValueError, match="capture_or_states must hold tensors"):
        hidden_stats([[1.0]])


def test_default_path_untouched_without_a_context():
    """No context: the layer keeps its backend and the fused path; capture_attention still works beside it."""
    layer = DiffAttention(32, 4, causal=True).eval()
    x = torch.randn(2, 5, 32)
    seen = []
    token = ops.SCORE_HOOK.set(lambda s, m: seen.append(1) or s)
    try:
        with torch.no_grad():
            layer(x)  # sdpa backend: the hook of the math path is never called
        assert seen == []
        with torch.no_grad(), capture_attention(layer):
            layer(x)  # the math path (maps asked for) calls it, once per map
        assert seen == [1, 1]
    finally:
        ops.SCORE_HOOK.reset(token)


def test_soft_capped_layer_records_the_capped_logits():
    """With Gemma-2's soft-capping the softmax sees c · tanh(S / c): that is what is recorded and quantised."""
    torch.manual_seed(0)
    layer = DiffAttention(32, 4, causal=True, softcap=2.0).double().eval()
    with torch.no_grad():
        layer.q_proj.weight.mul_(20.0)
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    with torch.no_grad(), capture_logits(layer) as cap:
        layer(x)
        ref = _ref_logits(layer, "diff", x)
    for got, s in zip(cap.layers[0]["logits"], ref):
        assert (got - 2.0 * torch.tanh(s / 2.0)).abs().max().item() <= 1e-12
        assert got.abs().max().item() < 2.0 < s.abs().max().item()  # the cap bit


def test_the_usage_example_in_docs_runs():
    """docs/evaluation.md's example of the four functions runs as written."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text(encoding="utf-8")
    section = doc.split("### Attention logits, activation outliers and quantised logits", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    ns: dict = {"__name__": "__doc_example__"}
    exec(compile(code, "docs/evaluation.md", "exec"), ns)
    st = logit_stats(ns["cap"], per_map=True)
    assert st["count"] == 2 * 2 * 2 * 2 * (32 * 33 // 2)  # layers × maps × B × H × causal entries
    assert set(st["per_map"]) == {"A1", "A2"} and hidden_stats(ns["hs"])["count"] == 2 * 2 * 32 * 64
    assert ns["logits_4bit"].shape == (2, 32, 256)


# ------------------------------------------------------------------------------- Stable Audio 3's DiT (diffusers)


def _stable_audio_logits(module: torch.nn.Module, x: torch.Tensor, rope, context) -> list[torch.Tensor]:
    """S1 = Q1 K1ᵀ / √d and S2 = Q2 K2ᵀ / √d of one diffusers Stable Audio 3 module, written out from its fused
    projections ([q1 | q2 | k1 | k2 | v] for self-attention; [q1 | q2] and [k1 | k2 | v] for cross-attention), its
    QK-norms and diffusers' own partial rotation (self-attention only)."""
    from diffusers.models.transformers.transformer_stable_audio3 import _apply_rotary_partial

    def heads(t):  # (B, N, h·d) → (B, N, h, d), diffusers' layout
        return t.unflatten(-1, (module.heads, module.dim_heads))

    if context is None:
        q1, q2, k1, k2, _ = map(heads, module.to_qkv(x).chunk(5, dim=-1))
    else:
        q1, q2 = map(heads, module.to_q(x).chunk(2, dim=-1))
        k1, k2, _ = map(heads, module.to_kv(context).chunk(3, dim=-1))
    q1, q2, k1, k2 = module.q_norm(q1), module.q_norm(q2), module.k_norm(k1), module.k_norm(k2)
    if context is None:
        q1, q2, k1, k2 = (_apply_rotary_partial(t, rope) for t in (q1, q2, k1, k2))
    return [q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / module.dim_heads**0.5 for q, k in ((q1, k1), (q2, k2))]


@pytest.mark.parametrize("processor", ["diffusers", "diffattn"])
def test_stable_audio_dit_logits_are_q1k1_and_q2k2_after_the_norm_and_rope(processor):
    """diffusers' StableAudio3DiTModel (float64, 2 blocks, 4 heads, memory tokens): both maps' logits of every self-
    and cross-attention module and head equal the ones written out above to 1e-10; the DiT's output is the one
    without the context; the processors it had come back (diffusers' own, or diffattn's with its on_maps)."""
    pytest.importorskip("diffusers", reason="diffusers >= 0.40 (pip install 'diffattn[audio]') runs the DiT")
    from diffattn.adapters.diffusers import (
        StableAudio3DiffattnProcessor,
        capture_stable_audio_maps,
        stable_audio_attention_modules,
    )

    from .test_adapters_diffusers import _dit, _inputs

    model = _dit()
    if processor == "diffattn":
        model.set_attn_processor(StableAudio3DiffattnProcessor("sdpa"))
    modules = stable_audio_attention_modules(model)
    assert [(n, k) for n, _, k in logit_layers(model)] == [(n, "stable_audio") for n, _ in modules]
    before = [m.processor for _, m in modules]
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, kw, n=n: inputs.setdefault(n, (args, kw)),
                                         with_kwargs=True) for n, m in modules]
    x, t, ctx, glob, _ = _inputs()
    with torch.no_grad():
        ref = model(x, t, ctx, glob).sample
        with capture_logits(model) as cap:
            out = model(x, t, ctx, glob).sample
    for h in hooks:
        h.remove()
    assert (out - ref).abs().max().item() <= 1e-10
    assert [m.processor for _, m in modules] == before
    assert [e["name"] for e in cap.layers] == [n for n, _ in modules]
    for entry, (name, module) in zip(cap.layers, modules):
        args, kw = inputs[name]
        cross = name.endswith("cross_attn")
        want = _stable_audio_logits(module, args[0], None if cross else kw["rope"], kw["context"] if cross else None)
        assert entry["kind"] == "stable_audio" and len(entry["logits"]) == 2
        for got, s in zip(entry["logits"], want):
            assert got.dtype == torch.float64 and got.shape == (2, 4, 13, 7 if cross else 13)
            assert (got - s).abs().max().item() <= 1e-10
        assert entry["mask"].shape == (13, 7 if cross else 13) and bool(entry["mask"].all())
    st = logit_stats(cap, per_map=True)
    assert st["count"] == 2 * 2 * 2 * 4 * 13 * (13 + 7) and set(st["per_map"]) == {"A1", "A2"}
    # under capture_stable_audio_maps (whose processor computes the maps a second time, on the side) each call
    # still records its two maps once, and the maps are still captured
    with torch.no_grad(), capture_stable_audio_maps(model) as maps, capture_logits(model) as cap2:
        model(x, t, ctx, glob)
    assert [len(e["logits"]) for e in cap2.layers] == [2] * 4 and all(len(v) == 1 for v in maps.values())
    for e1, e2 in zip(cap.layers, cap2.layers):
        assert all(torch.equal(a, b) for a, b in zip(e1["logits"], e2["logits"]))
    # the other logit diagnostics on the DiT: its blocks' hidden states, quantised logits
    with torch.no_grad(), capture_hidden_states(model) as hs:
        model(x, t, ctx, glob)
    assert [s["name"] for s in hs.states] == ["transformer_blocks.0", "transformer_blocks.1"]
    with torch.no_grad(), quantized_logits(model, 16):
        q16 = model(x, t, ctx, glob).sample
    with torch.no_grad(), quantized_logits(model, 2):
        q2 = model(x, t, ctx, glob).sample
    assert (q16 - ref).abs().max().item() < 1e-3 < (q2 - ref).abs().max().item()
    assert [m.processor for _, m in modules] == before
