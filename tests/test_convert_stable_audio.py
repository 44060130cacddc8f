"""Stable Audio 3's layouts: Stability's fused projection ↔ diffusers', and diffusers' attention modules ↔
StableAudioAttention, exactly (round trips bit for bit; the converted layer is a float64 reference of Stability's
layout)."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from diffattn.convert.stable_audio import (
    diffusers_to_stability_qkv,
    diffusers_to_stability_state_dict,
    from_diffusers_stable_audio,
    stability_to_diffusers_qkv,
    stability_to_diffusers_state_dict,
    to_diffusers_stable_audio,
)
from diffattn.layers import StableAudioAttention

D, H, d = 32, 2, 16  # width, heads, head width


def _labelled_qkv(parts: list[float]) -> torch.Tensor:
    """A (5·D, D) weight whose part j (D rows) is filled with parts[j]."""
    return torch.cat([torch.full((D, D), float(v)) for v in parts])


# ------------------------------------------------------------------------------------------ fused layouts

def test_the_parts_of_to_qkv_move_to_their_places_and_back():
    q, k, v, q_diff, k_diff = 1, 2, 3, 4, 5
    stability = _labelled_qkv([q, k, v, q_diff, k_diff])
    diffusers = stability_to_diffusers_qkv(stability)
    assert torch.equal(diffusers, _labelled_qkv([q, q_diff, k, k_diff, v]))  # [q1 | q2 | k1 | k2 | v]
    assert torch.equal(diffusers_to_stability_qkv(diffusers), stability)
    w = torch.randn(5 * D, D, dtype=torch.float64)
    assert torch.equal(stability_to_diffusers_qkv(diffusers_to_stability_qkv(w)), w)


def test_state_dicts_permute_only_the_differential_fused_projections():
    w5, w3, other = torch.randn(5 * D, D), torch.randn(3 * D, D), torch.randn(D, D)
    sd = {"blocks.0.self_attn.to_qkv.weight": w5, "to_qkv.weight": w5, "blocks.1.self_attn.to_qkv.weight": w3,
          "blocks.0.cross_attn.to_kv.weight": other}
    out = stability_to_diffusers_state_dict(sd)
    assert list(out) == list(sd)
    assert torch.equal(out["blocks.0.self_attn.to_qkv.weight"], stability_to_diffusers_qkv(w5))
    assert torch.equal(out["to_qkv.weight"], stability_to_diffusers_qkv(w5))
    assert out["blocks.1.self_attn.to_qkv.weight"] is w3 and out["blocks.0.cross_attn.to_kv.weight"] is other
    back = diffusers_to_stability_state_dict(out)
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_a_weight_that_is_no_differential_to_qkv_is_refused():
    with pytest.raises(ValueError, match=r"weight must be a differential to_qkv weight of shape \(5·dim, dim\), got "
                                         r"\(96, 32\)"):
        stability_to_diffusers_qkv(torch.randn(3 * D, D))
    with pytest.raises(ValueError, match="state_dict must be a mapping"):
        stability_to_diffusers_state_dict([torch.randn(2)])


def test_writing_a_diffusers_module_without_diffusers_names_the_extra(monkeypatch):
    for name in [n for n in sys.modules if n.split(".")[0] == "diffusers"] + ["diffusers"]:
        monkeypatch.setitem(sys.modules, name, None)  # as where diffusers is not installed
    with pytest.raises(ImportError, match=r"needs diffusers >= 0.40 .*pip install 'diffattn\[audio\]'"):
        to_diffusers_stable_audio(StableAudioAttention(D, H))


# ---------------------------------------------------------------------------------------- modules ↔ layer

@pytest.fixture(scope="module")
def sa3():
    """diffusers' Stable Audio 3 module (the tests above run without diffusers)."""
    pytest.importorskip("diffusers", reason="diffusers >= 0.40 (pip install 'diffattn[audio]') holds Stable Audio 3's "
                                            "modules")
    from diffusers.models.transformers import transformer_stable_audio3

    return transformer_stable_audio3


def _module(sa3, cross: bool = False, dtype=torch.float64):
    torch.manual_seed(0)
    m = sa3.StableAudio3CrossAttention(D, 24, dim_heads=d) if cross else sa3.StableAudio3SelfAttention(D, dim_heads=d)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m.to(dtype)


def stability_reference(w_qkv, w_out, g_q, g_k, x, eps=1e-6):
    """Stable Audio 3 self-attention written from Stability's layout, float64: q, k, v, q_diff, k_diff =
    to_qkv(x).chunk(5); RMS QK-norm over d; rotate-half RoPE on the first d/2 channels (θ_m = 10000^(−2m/(d/2)),
    positions 0…N−1); attn(q, k, v) − attn(q_diff, k_diff, v); to_out."""
    B, N, _ = x.shape
    q, k, v, q_diff, k_diff = (t.view(B, N, H, d).transpose(1, 2) for t in (x @ w_qkv.T).chunk(5, dim=-1))

    def norm(t, g):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * g

    r = d // 2
    ang = torch.arange(N, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(t):
        a, b = t[..., : r // 2], t[..., r // 2: r]
        return torch.cat([t[..., :r] * cos + torch.cat([-b, a], -1) * sin, t[..., r:]], -1)

    def attn(q_, k_):
        return torch.softmax(rope(norm(q_, g_q)) @ rope(norm(k_, g_k)).transpose(-1, -2) / math.sqrt(d), -1) @ v

    return (attn(q, k) - attn(q_diff, k_diff)).transpose(1, 2).reshape(B, N, D) @ w_out.T


def test_a_stability_checkpoint_through_diffusers_layout_is_the_layer(sa3):
    """Stability's [q, k, v, q_diff, k_diff] → diffusers' module → StableAudioAttention: the layer computes
    Stability's formula on Stability's weights, ≤ 1e-12 in float64."""
    torch.manual_seed(3)
    w_qkv, w_out = torch.randn(5 * D, D, dtype=torch.float64) / 4, torch.randn(D, D, dtype=torch.float64) / 4
    g_q, g_k = 1 + 0.3 * torch.randn(d, dtype=torch.float64), 1 + 0.3 * torch.randn(d, dtype=torch.float64)
    module = _module(sa3)
    module.load_state_dict({"to_qkv.weight": stability_to_diffusers_qkv(w_qkv), "to_out.weight": w_out,
                            "q_norm.gamma": g_q, "k_norm.gamma": g_k})
    layer = from_diffusers_stable_audio(module)
    x = torch.randn(2, 11, D, dtype=torch.float64)
    with torch.no_grad():
        assert (layer(x) - stability_reference(w_qkv, w_out, g_q, g_k, x)).abs().max().item() <= 1e-12


def test_the_layer_is_the_self_attention_module(sa3):
    """diffusers rotates in float32 whatever the dtype, so the layer and the module agree to float32 rounding; the
    mapping itself is exact (the test above)."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-6)):  # relative to the largest output
        module = _module(sa3, dtype=dtype)
        layer = from_diffusers_stable_audio(module)
        assert isinstance(layer, StableAudioAttention) and layer.q_proj.weight.dtype == dtype
        assert (layer.config.rope, layer.config.rotary_fraction, layer.rotary.head_dim) == ("half", 0.5, d // 2)
        x = torch.randn(2, 9, D, dtype=dtype)
        rope = sa3.StableAudio3RotaryEmbedding(d // 2).to(dtype)(9, x.device)
        with torch.no_grad():
            want = module(x, rope)
            assert (layer(x) - want).abs().max().item() <= tol * want.abs().max().item()


def test_the_layer_is_the_cross_attention_module_with_a_context_mask(sa3):
    module = _module(sa3, cross=True)
    for norm in (module.q_norm, module.k_norm):
        norm.force_fp32 = False  # diffusers' norm in float64 too: nothing rounds to float32 on either side
    layer = from_diffusers_stable_audio(module)
    assert layer.context_dim == 24 and layer.rotary is None
    x, c = torch.randn(2, 9, D, dtype=torch.float64), torch.randn(2, 5, 24, dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True, False], [True] * 5])
    with torch.no_grad():
        got = layer(x, mask[:, None, None, :], context=c)
        assert (got - module(x, c, mask)).abs().max().item() <= 1e-12


@pytest.mark.parametrize("cross", [False, True])
def test_round_trips_are_bit_for_bit(sa3, cross):
    module = _module(sa3, cross=cross)
    module.q_norm.eps = module.k_norm.eps = 1e-5
    layer = from_diffusers_stable_audio(module)
    assert layer.config.qk_norm_eps == 1e-5
    back = to_diffusers_stable_audio(layer, cross=cross)
    assert type(back) is type(module) and back.q_norm.eps == back.k_norm.eps == 1e-5
    sd, sd_back = module.state_dict(), back.state_dict()
    assert list(sd_back) == list(sd) and all(torch.equal(sd[k], sd_back[k]) for k in sd)
    again = from_diffusers_stable_audio(back)
    assert again.config == layer.config
    assert all(torch.equal(a, b) for a, b in zip(layer.state_dict().values(), again.state_dict().values()))


@pytest.mark.parametrize("settings,cross,match", [
    ({"qkv_bias": True}, False, "needs qkv_bias=False; the layer has qkv_bias=True"),
    ({"rotary_fraction": 1.0}, False, "needs rotary_fraction=0.5; the layer has rotary_fraction=1.0"),
    ({"causal": True}, True, "needs causal=False"),
    ({"num_kv_heads": 1}, True, "has no grouped-query attention"),
    ({"context_dim": 24}, False, "context_dim=24 != dim=32: convert it with cross=True"),
])
def test_what_diffusers_cannot_express_is_refused(sa3, settings, cross, match):
    with pytest.raises(ValueError, match=match):
        to_diffusers_stable_audio(StableAudioAttention(D, H, **settings), cross=cross)


def test_modules_the_layer_cannot_take_are_refused(sa3):
    with pytest.raises(ValueError, match="has use_differential=False"):
        from_diffusers_stable_audio(sa3.StableAudio3SelfAttention(D, dim_heads=d, use_differential=False))
    with pytest.raises(ValueError, match=r"odd d/2 = 3"):
        from_diffusers_stable_audio(sa3.StableAudio3SelfAttention(24, dim_heads=6))
    with pytest.raises(ValueError, match="module must be diffusers' StableAudio3SelfAttention"):
        from_diffusers_stable_audio(torch.nn.Linear(2, 2))
