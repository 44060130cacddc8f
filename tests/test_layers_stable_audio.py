"""Stable Audio 3's differential attention as an attention kind: the layer against a float64 reference of the
formula written out here (Stability AI 2026, arXiv 2605.17991), self- and cross-attention, its maps, its KV cache,
its settings and their errors, and the kind through a model and a save."""

from __future__ import annotations

import math

import pytest
import torch

import diffattn
from diffattn.layers import ATTENTION_TYPES, AttentionSpec, KVCache, StableAudioAttention, attention_kind
from diffattn.layers.stable_audio import rotary_width


def _rms(t: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(t: torch.Tensor, r: int, theta: float, positions: torch.Tensor, style: str) -> torch.Tensor:
    """RoPE on the first r channels of t (B, H, N, d), θ_m = θ^(−2m/r) for pair m: channels (m, m + r/2)
    ("half") or (2m, 2m + 1) ("interleaved"); the other channels passed through."""
    inv = theta ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = positions.to(torch.float64)[:, None] * inv  # (N, r/2)
    cos, sin = ang.cos(), ang.sin()
    rot, rest = t[..., :r], t[..., r:]
    if style == "half":
        a, b = rot[..., : r // 2], rot[..., r // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1)
    a, b = rot[..., 0::2], rot[..., 1::2]
    return torch.cat([torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2), rest], dim=-1)


def reference(layer: StableAudioAttention, x, *, context=None, mask=None, causal=False, positions=None):
    """(A(Q1_i, K1_i) − A(Q2_i, K2_i)) V_i per head in float64 from the layer's weights: Q heads (2i, 2i+1) are
    (Q1_i, Q2_i), K heads likewise, RMS QK-norm over d, RoPE on the first r channels (self-attention only), GQA:
    head i reads K/V head i // (h / h_kv); ``mask`` (B, 1, N, M) bool, True = attend."""
    w = {k: v.double() for k, v in layer.state_dict().items()}
    h, hkv, d, eps = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.config.qk_norm_eps
    src = x if context is None else context
    B, N, _ = x.shape
    M = src.shape[1]

    def lin(t, name):
        y = t @ w[f"{name}.weight"].T
        return y + w[f"{name}.bias"] if f"{name}.bias" in w else y

    q = lin(x, "q_proj").view(B, N, h, 2, d).permute(3, 0, 2, 1, 4)  # (2, B, h, N, d)
    k = lin(src, "k_proj").view(B, M, hkv, 2, d).permute(3, 0, 2, 1, 4)  # (2, B, h_kv, M, d)
    v = lin(src, "v_proj").view(B, M, hkv, d).transpose(1, 2)
    if layer.config.qk_norm:
        q, k = _rms(q, w["q_norm.weight"], eps), _rms(k, w["k_norm.weight"], eps)
    if layer.config.rope is not None and context is None:
        r = round(d * layer.config.rotary_fraction)
        pos = torch.arange(N) if positions is None else positions
        q, k = (_rope(t, r, layer.config.rope_theta, pos, layer.config.rope) for t in (q, k))
    k, v = k.repeat_interleave(h // hkv, dim=2), v.repeat_interleave(h // hkv, dim=1)
    keep = torch.ones(B, 1, N, M, dtype=torch.bool)
    if mask is not None:
        keep = keep & mask
    if causal:
        keep = keep & torch.ones(N, M, dtype=torch.bool).tril(M - N)
    maps = [torch.softmax((q[b] @ k[b].transpose(-1, -2) / math.sqrt(d)).masked_fill(~keep, -math.inf), -1)
            for b in range(2)]
    o = (maps[0] - maps[1]) @ v  # (B, h, N, d)
    return lin(o.transpose(1, 2).reshape(B, N, h * d), "out_proj"), maps


def _layer(dim=48, heads=4, **settings) -> StableAudioAttention:
    torch.manual_seed(0)
    layer = StableAudioAttention(dim, heads, **settings).double().eval()
    with torch.no_grad():  # norm scales away from 1 and larger logits, so every factor shows
        for name, p in layer.named_parameters():
            p.add_(0.5 * torch.randn_like(p) if "norm" in name else 0.0)
        layer.q_proj.weight.mul_(3.0)
    return layer


# ----------------------------------------------------------------------------------------------- the kind

def test_the_kind_is_registered_with_its_own_config():
    spec = AttentionSpec("stable_audio")
    assert ATTENTION_TYPES["stable_audio"] is StableAudioAttention and type(spec) is StableAudioAttention.Config
    assert StableAudioAttention.differential and StableAudioAttention.head_layout == "paired"
    # SA3's defaults: no biases, rotate-half RoPE on half of each head, QK-norm eps 1e-6
    assert (spec.qkv_bias, spec.out_bias, spec.rope, spec.rotary_fraction, spec.qk_norm, spec.qk_norm_eps,
            spec.context_dim) == (False, False, "half", 0.5, True, 1e-6, None)
    layer = spec.build(64, 4)
    assert attention_kind(layer) == "stable_audio" and layer.rotary.head_dim == 8
    assert [(n, tuple(p.shape)) for n, p in layer.named_parameters()] == [
        ("q_proj.weight", (128, 64)), ("k_proj.weight", (128, 64)), ("v_proj.weight", (64, 64)),
        ("out_proj.weight", (64, 64)), ("q_norm.weight", (16,)), ("k_norm.weight", (16,))]
    assert layer.lambda_weights(torch.zeros(1, 1, 64)) == (1.0, 1.0)
    assert AttentionSpec.from_dict(spec.to_dict()) == spec
    assert spec.updated({"rotary_fraction": 1.0}).rotary_fraction == 1.0


@pytest.mark.parametrize("settings,match", [
    ({"rotary_fraction": 0.0}, "attention rotary_fraction must be a finite float > 0, got 0.0"),
    ({"rotary_fraction": 1.5}, r"attention rotary_fraction must be in \(0, 1\], got 1.5"),
    ({"qk_norm_eps": -1.0}, "attention qk_norm_eps must be a finite float > 0, got -1.0"),
    ({"qk_norm": 1}, "attention qk_norm must be a bool, got 1"),
    ({"context_dim": 0}, "attention context_dim must be None or an integer >= 1, got 0"),
])
def test_bad_settings_name_the_setting(settings, match):
    with pytest.raises(ValueError, match=match):
        AttentionSpec("stable_audio", **settings)


def test_a_rotary_fraction_that_gives_no_even_channel_count_is_refused():
    assert rotary_width(16, 0.5) == 8 and rotary_width(16, 1.0) == 16
    with pytest.raises(ValueError, match=r"rotary_fraction=0.3 of head width d=16 gives 4.8 channels"):
        StableAudioAttention(64, 4, rotary_fraction=0.3)
    with pytest.raises(ValueError, match=r"rotary_fraction=0.5 of head width d=6 gives 3 channels"):
        StableAudioAttention(24, 4)


# ------------------------------------------------------------------------------------------- the formula

@pytest.mark.parametrize("case", ["self", "self_gqa_causal", "full_rope", "no_rope_no_norm", "interleaved"])
def test_self_attention_is_the_reference(case):
    settings = {"self": {}, "self_gqa_causal": {"num_kv_heads": 2, "causal": True},
                "full_rope": {"rotary_fraction": 1.0, "rope_theta": 500.0},
                "no_rope_no_norm": {"rope": None, "qk_norm": False, "qkv_bias": True, "out_bias": True},
                "interleaved": {"rope": "interleaved"}}[case]
    layer = _layer(**settings)
    x = torch.randn(2, 7, 48, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x)
        want, _ = reference(layer, x, causal=layer.causal)
    assert (out - want).abs().max().item() <= 1e-12


def test_cross_attention_is_the_reference_with_a_context_mask():
    layer = _layer(context_dim=20)
    x, c = torch.randn(2, 7, 48, dtype=torch.float64), torch.randn(2, 5, 20, dtype=torch.float64)
    mask = torch.tensor([[True] * 3 + [False] * 2, [True] * 5])[:, None, None, :]  # (B, 1, 1, M)
    with torch.no_grad():
        out, maps = layer(x, mask, True, context=c)
        want, (a1, a2) = reference(layer, x, context=c, mask=mask)
    assert (out - want).abs().max().item() <= 1e-12
    assert (maps.first - a1).abs().max().item() <= 1e-12 and (maps.second - a2).abs().max().item() <= 1e-12
    assert torch.equal(maps.combined, maps.first - maps.second)  # λ = 1, w1 = 1
    assert float(maps.first[0, ..., 3:].abs().max()) == 0.0  # masked context keys get no weight


def test_backends_and_the_maps_on_the_side():
    layer = _layer(causal=True)
    x = torch.randn(2, 9, 48, dtype=torch.float64)
    with torch.no_grad():
        ref = layer(x)
        out, maps = layer(x, need_weights=True)
        for backend in ("math", "sdpa"):
            layer.backend = backend
            assert (layer(x) - ref).abs().max().item() <= 1e-12
    assert torch.equal(out, ref)
    torch.testing.assert_close(maps.first.sum(-1), torch.ones(2, 4, 9, dtype=torch.float64))
    assert float(maps.second.triu(1).abs().max()) == 0.0


def test_decoding_with_a_kv_cache_equals_the_full_causal_pass():
    layer = _layer(causal=True, num_kv_heads=2)
    x = torch.randn(2, 9, 48, dtype=torch.float64)
    cache = KVCache()
    with torch.no_grad():
        full = layer(x)
        steps = [layer(x[:, :6], kv_cache=cache)] + [layer(x[:, i:i + 1], kv_cache=cache) for i in range(6, 9)]
    assert cache.length == 9
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-12


def test_gradients_flow_to_every_parameter():
    layer = _layer(context_dim=20).train()
    x, c = torch.randn(2, 5, 48, dtype=torch.float64), torch.randn(2, 4, 20, dtype=torch.float64)
    (layer(x, context=c).square().sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


@pytest.mark.parametrize("call,match", [
    (lambda l, x, c: l(x, context=c[:, :, :4]), r"context must be a tensor of shape \(B=2, M, context_dim=20\), "
                                                r"got \(2, 3, 4\)"),
    (lambda l, x, c: l(x), r"projects keys and values from a context of width context_dim=20 \(dim=48\); call it "
                           r"with context="),
    (lambda l, x, c: l(x, context=c, kv_cache=KVCache()), "kv_cache is for self-attention"),
    (lambda l, x, c: l(x, context=c, position_ids=torch.arange(5)), "cross-attention \\(context=...\\) has none"),
    (lambda l, x, c: l(x, context=c.float()), "context must have x's dtype and device"),
])
def test_bad_calls_say_what_they_need(call, match):
    layer = _layer(context_dim=20)
    with pytest.raises(ValueError, match=match):
        call(layer, torch.randn(2, 5, 48, dtype=torch.float64), torch.randn(2, 3, 20, dtype=torch.float64))


# ---------------------------------------------------------------------------------------- through a model

def test_the_kind_runs_through_a_model_a_save_and_a_load(tmp_path):
    torch.manual_seed(0)
    lm = diffattn.models.CausalLM(vocab_size=40, dim=32, depth=2, num_heads=2, max_seq_len=16,
                                  attention={"kind": "stable_audio", "causal": True}).eval()
    assert type(lm.blocks[0].attn) is StableAudioAttention
    ids = torch.randint(0, 40, (2, 10))
    lm.save_pretrained(tmp_path / "lm")
    loaded = diffattn.from_pretrained(tmp_path / "lm").eval()
    assert loaded.attention_spec == lm.attention_spec
    with torch.no_grad():
        assert torch.equal(loaded(ids), lm(ids))
    vit = diffattn.create_model("vit_nano", img_size=32, num_classes=10,
                                attention={"kind": "stable_audio", "rotary_fraction": 1.0})
    assert vit(torch.randn(1, 3, 32, 32)).shape == (1, 10)
