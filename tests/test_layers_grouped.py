"""GroupedDiffAttention (GDA, Motif Technologies 2025, arXiv 2510.06949) against a float64 reference written from
the paper's equations, DiffAttention at ratio 1:1, every backend, and decoding with the static KV cache."""

import math

import pytest
import torch

from diffattn.layers import (
    ATTENTION_TYPES,
    AttentionSpec,
    DiffAttention,
    GroupedDiffAttention,
    KVCache,
    StaticKVCache,
    attention_class,
)


def _rope_half(t, pos, theta):
    """Rotate-half RoPE (channels m, m + d/2 pair) on t (N, d) at positions pos (N,), float64."""
    d = t.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]  # (N, d/2)
    cos, sin = torch.cos(ang).repeat(1, 2), torch.sin(ang).repeat(1, 2)
    rot = torch.cat([-t[:, d // 2:], t[:, : d // 2]], dim=-1)
    return t * cos + rot * sin


def reference_gda(layer, x, *, lam_per_group, causal=False, key_mask=None, rope_theta=None):
    """GDA written from the paper's equations, one head at a time in float64 (no diffattn operator).

    x (B, N, D); lam_per_group: (H_n,) λ of each group; key_mask (B, Nk) bool, True = attend.
    """
    sd = {k: v.detach().double() for k, v in layer.state_dict().items()}
    hs, hn, hkv, d = layer.num_signal_heads, layer.num_noise_heads, layer.num_kv_heads, layer.head_dim
    r = hs // hn
    B, N, _ = x.shape

    def lin(name, t):
        out = t @ sd[f"{name}.weight"].T
        return out + sd[f"{name}.bias"] if f"{name}.bias" in sd else out

    q, k, v = lin("q_proj", x), lin("k_proj", x), lin("v_proj", x)
    w = sd.get("diff_norm.weight", torch.ones(2 * d, dtype=torch.float64))
    eps = layer.diff_norm.eps
    out = torch.zeros(B, N, hs * 2 * d, dtype=torch.float64)
    pos = torch.arange(N)
    for b in range(B):
        for i in range(hs):
            g = i // r
            qs = q[b, :, (g * (r + 1) + i % r) * d:(g * (r + 1) + i % r + 1) * d]  # signal query of head i
            qn = q[b, :, (g * (r + 1) + r) * d:(g * (r + 1) + r + 1) * d]  # the noise query of its group
            m = i // (hs // (hkv // 2))
            k1, k2 = k[b, :, 2 * m * d:(2 * m + 1) * d], k[b, :, (2 * m + 1) * d:(2 * m + 2) * d]
            vm = v[b, :, 2 * m * d:(2 * m + 2) * d]  # (N, 2d)
            if rope_theta is not None:
                qs, qn, k1, k2 = (_rope_half(t, pos, rope_theta) for t in (qs, qn, k1, k2))
            allowed = torch.ones(N, N, dtype=torch.bool)
            if causal:
                allowed &= torch.tril(allowed)
            if key_mask is not None:
                allowed &= key_mask[b][None, :]
            a1 = torch.softmax((qs @ k1.T / math.sqrt(d)).masked_fill(~allowed, float("-inf")), dim=-1)
            a2 = torch.softmax((qn @ k2.T / math.sqrt(d)).masked_fill(~allowed, float("-inf")), dim=-1)
            o = (a1 - lam_per_group[g] * a2) @ vm  # (N, 2d)
            o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + eps) * w * (1.0 - layer.lambda_init)
            out[b, :, i * 2 * d:(i + 1) * 2 * d] = o
    return lin("out_proj", out)


def _lambda(layer):
    fn = layer.lambda_fn
    lam = torch.exp((fn.lambda_q1.double() * fn.lambda_k1.double()).sum(-1)) \
        - torch.exp((fn.lambda_q2.double() * fn.lambda_k2.double()).sum(-1)) + layer.lambda_init
    return lam.expand(layer.num_noise_heads) if lam.dim() == 0 else lam


def _layer(**kw):
    torch.manual_seed(0)
    layer = GroupedDiffAttention(**kw).double().eval()
    with torch.no_grad():
        if getattr(layer.diff_norm, "weight", None) is not None:
            layer.diff_norm.weight.uniform_(0.5, 1.5)
        for p in (layer.lambda_q1, layer.lambda_k1, layer.lambda_q2, layer.lambda_k2):
            p.normal_(0, 0.3)
    return layer


CASES = [  # (num_heads = H_s + H_n, num_noise_heads, num_kv_heads, head_dim)
    (4, 2, 4, 8),   # 1:1, differential attention
    (6, 2, 4, 8),   # 2:1, two kv pairs
    (8, 2, 2, 8),   # 3:1, one kv pair shared by all
    (12, 2, 4, 6),  # 5:1, head_dim independent of dim
    (6, 1, 2, 8),   # 5:1 with one noise head
]


@pytest.mark.parametrize("heads,noise,kv,d", CASES)
@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
def test_matches_the_float64_reference(heads, noise, kv, d, backend):
    layer = _layer(dim=40, num_heads=heads, num_noise_heads=noise, num_kv_heads=kv, head_dim=d, depth=0,
                   lambda_init="motif", backend=backend)
    x = torch.randn(2, 9, 40, dtype=torch.float64)
    lam = _lambda(layer).detach()
    with torch.no_grad():
        assert (layer(x) - reference_gda(layer, x, lam_per_group=lam)).abs().max().item() <= 1e-10
        out = layer(x, is_causal=True)
        assert (out - reference_gda(layer, x, lam_per_group=lam, causal=True)).abs().max().item() <= 1e-10
        keys = torch.rand(2, 9) > 0.3
        keys[:, 0] = True
        out = layer(x, attn_mask=keys[:, None, None, :])
        assert (out - reference_gda(layer, x, lam_per_group=lam, key_mask=keys)).abs().max().item() <= 1e-10


def test_per_group_lambda_and_rope_match_the_reference():
    layer = _layer(dim=48, num_heads=8, num_noise_heads=2, num_kv_heads=4, head_dim=8, lambda_init=0.5,
                   lambda_options={"per_head": True}, rope="half", rope_theta=500.0, causal=True)
    assert layer.lambda_q1.shape == (2, 8)  # one λ per noise head = per group
    lam = _lambda(layer).detach()
    assert lam.shape == (2,) and not torch.allclose(lam[0], lam[1])
    x = torch.randn(2, 6, 48, dtype=torch.float64)
    with torch.no_grad():
        ref = reference_gda(layer, x, lam_per_group=lam, causal=True, rope_theta=500.0)
        for backend in ("math", "sdpa"):
            layer.backend = backend
            assert (layer(x) - ref).abs().max().item() <= 1e-10


@pytest.mark.parametrize("kv", [2, 4])
def test_ratio_one_is_diff_attention_with_the_same_weights(kv):
    g = _layer(dim=32, num_heads=4, num_kv_heads=kv, depth=3, lambda_init="ye", causal=True, rope="half")
    assert g.num_noise_heads == 2 and g.group_ratio == 1
    d = DiffAttention(32, 4, num_kv_heads=kv, depth=3, lambda_init="ye", causal=True, rope="half").double().eval()
    d.load_state_dict(g.state_dict(), strict=True)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        for backend in ("math", "sdpa", "auto"):
            g.backend = d.backend = backend
            assert torch.equal(g(x), d(x))
    assert sum(p.numel() for p in g.parameters()) == sum(p.numel() for p in d.parameters())


@pytest.mark.parametrize("heads,noise,kv,d", CASES)
def test_backends_agree_float32_and_gradients_flow(heads, noise, kv, d):
    layer = GroupedDiffAttention(40, heads, num_noise_heads=noise, num_kv_heads=kv, head_dim=d, causal=True,
                                 rope="half")
    x = torch.randn(2, 11, 40, requires_grad=True)
    outs = {}
    for backend in ("math", "sdpa"):
        layer.backend = backend
        outs[backend] = layer(x)
    assert (outs["math"] - outs["sdpa"]).abs().max().item() <= 1e-5
    outs["sdpa"].square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("cache_cls", [StaticKVCache, KVCache])
@pytest.mark.parametrize("heads,noise,kv,d", CASES[1:4])
def test_decoding_with_the_cache_equals_the_full_forward(cache_cls, heads, noise, kv, d):
    layer = _layer(dim=40, num_heads=heads, num_noise_heads=noise, num_kv_heads=kv, head_dim=d, causal=True,
                   rope="half", lambda_init="motif", depth=1)
    x = torch.randn(2, 10, 40, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
        cache = cache_cls(10) if cache_cls is StaticKVCache else cache_cls()
        steps = [layer(x[:, :4], kv_cache=cache)]  # prefill of 4, then one token at a time (the decode path)
        for t in range(4, 10):
            steps.append(layer(x[:, t:t + 1], kv_cache=cache))
    assert cache.length == 10
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-10


def test_need_weights_repeats_each_noise_map_over_its_group():
    layer = _layer(dim=40, num_heads=6, num_noise_heads=2, num_kv_heads=4, head_dim=8)
    x = torch.randn(1, 5, 40, dtype=torch.float64)
    with torch.no_grad():
        out, w = layer(x, need_weights=True)
    assert torch.allclose(out, layer(x), atol=1e-12)
    assert w.first.shape == w.second.shape == (1, 4, 5, 5)
    assert torch.equal(w.second[:, 0], w.second[:, 1]) and torch.equal(w.second[:, 2], w.second[:, 3])


def test_registered_kind_and_spec():
    assert ATTENTION_TYPES["grouped"] is GroupedDiffAttention is attention_class("grouped")
    layer = AttentionSpec("grouped", lambda_init="motif", causal=True, rope="half").build(32, 4, depth=0)
    assert isinstance(layer, GroupedDiffAttention) and layer.num_noise_heads == 2
    assert layer.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(0.3))  # Motif's layer 0: ≈ −0.0099
    assert layer.out_proj.in_features == 32 and layer.q_proj.out_features == 32


@pytest.mark.parametrize("heads,noise,kv,d", [(4, None, None, None), (10, 2, 4, 8), (6, 1, 2, 8), (12, 2, 4, 6)])
def test_spec_builds_any_ratio_and_round_trips_through_its_dict(heads, noise, kv, d):
    import json

    spec = AttentionSpec("grouped", lambda_init="motif", num_kv_heads=kv, causal=True, rope="half",
                         num_noise_heads=noise, head_dim=d, backend="math")
    torch.manual_seed(0)
    layer = spec.build(40 if d else 32, heads, depth=1)
    torch.manual_seed(0)
    ref = GroupedDiffAttention(40 if d else 32, heads, num_noise_heads=noise, num_kv_heads=kv, head_dim=d, depth=1,
                               lambda_init="motif", causal=True, rope="half", backend="math")
    assert type(layer) is GroupedDiffAttention and layer.num_noise_heads == (noise or heads // 2)
    assert layer.group_ratio == (heads - (noise or heads // 2)) // (noise or heads // 2)
    sd, ref_sd = layer.state_dict(), ref.state_dict()
    assert sd.keys() == ref_sd.keys() and all(torch.equal(sd[k], ref_sd[k]) for k in sd)
    x = torch.randn(2, 5, layer.q_proj.in_features)
    with torch.no_grad():
        assert torch.equal(layer(x), ref(x))
    saved = json.loads(json.dumps(spec.to_dict()))  # what a config.json holds
    assert saved["num_noise_heads"] == noise and saved["head_dim"] == d
    assert AttentionSpec.from_dict(saved) == spec
    assert AttentionSpec.from_dict(spec.to_dict(changed=True)) == spec


@pytest.mark.parametrize("kw,match", [
    (dict(kind="diff", num_noise_heads=2), "kind 'diff' has no setting num_noise_heads \\(a setting of kind "
                                           "'grouped', 'gdla'\\)"),
    (dict(kind="gated", head_dim=8), "kind 'gated' has no setting head_dim \\(a setting of kind 'diff_v2', 'grouped'"),
    (dict(kind="grouped", num_noise_heads=0), "num_noise_heads must be None or an integer >= 1, got 0"),
    (dict(kind="grouped", num_noise_heads=2, num_kv_heads=3), "num_kv_heads=3 must be even"),
    (dict(kind="grouped", num_noise_heads=3, num_kv_heads=4), "num_noise_heads=3 a multiple of num_kv_heads/2"),
])
def test_spec_validates_the_grouped_settings_when_made(kw, match):
    with pytest.raises(ValueError, match=match):
        AttentionSpec(**kw)


@pytest.mark.parametrize("kw,dim,heads,match", [
    (dict(num_noise_heads=3), 32, 8, "signal heads \\(num_heads − num_noise_heads = 8 − 3 = 5\\) must be a "
                                     "positive multiple of num_noise_heads=3"),
    (dict(num_noise_heads=3), 48, 4, "4 − 3 = 1"),
    (dict(), 30, 5, "num_heads=5 \\(odd\\) needs num_noise_heads"),
    (dict(), 36, 8, "dim=36 must be divisible by num_heads=8, or give head_dim"),
    (dict(num_kv_heads=4), 48, 6, "num_kv_heads=4 must be even, with the signal heads \\(3\\) and the noise heads "
                                  "\\(3\\) multiples of num_kv_heads/2"),
])
def test_spec_names_head_counts_it_cannot_build(kw, dim, heads, match):
    with pytest.raises(ValueError, match=match):
        AttentionSpec("grouped", **kw).build(dim, heads)


@pytest.mark.parametrize("kw,match", [
    (dict(num_heads=5), "num_heads=5 \\(odd\\) needs num_noise_heads"),
    (dict(num_heads=7, num_noise_heads=2), "multiple of num_noise_heads=2"),
    (dict(num_heads=4, num_noise_heads=3), "multiple of num_noise_heads=3"),
    (dict(num_heads=6, num_noise_heads=2, num_kv_heads=3), "num_kv_heads=3 must be even"),
    (dict(num_heads=6, num_noise_heads=2, num_kv_heads=8), "num_kv_heads=8 must be even"),
    (dict(num_heads=7, num_noise_heads=1), "divisible by num_heads=7"),
])
def test_invalid_head_counts_name_the_setting(kw, match):
    with pytest.raises(ValueError, match=match):
        GroupedDiffAttention(48, **kw)


def test_shapes_of_a_motif_2_12b_like_layer():
    layer = GroupedDiffAttention(64, 10, num_noise_heads=2, num_kv_heads=4, head_dim=16)  # 4:1
    assert layer.q_proj.out_features == 160 and layer.k_proj.out_features == 64
    assert layer.v_proj.out_features == 64 and layer.out_proj.in_features == 2 * 8 * 16
    assert layer.group_ratio == 4 and layer.diff_norm.normalized_shape == (32,)
