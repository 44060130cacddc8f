"""Diff Transformer V2: diffattn.DiffAttentionV2 and diffattn.convert.unilm against the official module.

The official ``MultiheadFlashDiffV2`` (microsoft/unilm, vendored unchanged in tests/fixtures/unilm) is loaded with
float64 reference implementations of the two GPU kernels it imports: flash-attn's ``flash_attn_func`` (causal
softmax attention with grouped K/V) and flash-attn's ``apply_rotary_emb`` (interleaved = GPT-J pairs (2m, 2m+1),
otherwise GPT-NeoX pairs (m, m + d/2)), both written here from their documented equations.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch

from diffattn import DiffAttentionV2
from diffattn.convert import (
    diffattn_to_unilm_v2_state_dict,
    from_unilm_v2,
    half_to_interleaved_perm,
    interleaved_to_half_perm,
    to_unilm_v2_state_dict,
    unilm_rel_pos,
    unilm_v2_to_diffattn_state_dict,
)

F64 = torch.float64
FIXTURE = Path(__file__).parent / "fixtures" / "unilm" / "multihead_flashdiffv2.py"


def flash_attn_func_f64(q, k, v, causal=False, softmax_scale=None):
    """softmax(q kᵀ · s + causal mask) v per query head j with K/V head j // (Hq / Hkv); (B, N, H, d) layout."""
    B, N, Hq, d = q.shape
    Hkv = k.shape[2]
    s = d**-0.5 if softmax_scale is None else softmax_scale
    heads = []
    for j in range(Hq):
        g = j // (Hq // Hkv)
        logits = torch.einsum("bnd,bmd->bnm", q[:, :, j], k[:, :, g]) * s
        if causal:
            logits = logits.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
        heads.append(torch.softmax(logits, dim=-1) @ v[:, :, g])
    return torch.stack(heads, dim=2)


def apply_rotary_emb_f64(x, cos, sin, interleaved=False, force_style=None):
    """flash-attn's rotary embedding on x (B, N, H, d) with tables (N, d/2): pair m rotated by the angle of column m."""
    interleaved = interleaved if force_style is None else force_style == "interleaved"
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)
    x0, x1 = x.chunk(2, dim=-1)
    return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)


def load_official(rope_style="interleaved"):
    """The vendored official module, its kernels replaced by the float64 references above (``rope_style="half"``
    makes its rotary call use GPT-NeoX pairs, as a checkpoint trained with that layout would need)."""
    flash_attn = types.ModuleType("flash_attn")
    flash_attn.flash_attn_func = flash_attn_func_f64
    kernel, rotary = types.ModuleType("kernel"), types.ModuleType("kernel.rotary")
    rotary.apply_rotary_emb = lambda *a, **kw: apply_rotary_emb_f64(*a, **kw, force_style=rope_style)
    kernel.rotary = rotary
    spec = importlib.util.spec_from_file_location(f"unilm_flashdiffv2_{rope_style}", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(sys.modules, {"flash_attn": flash_attn, "kernel": kernel, "kernel.rotary": rotary}), \
            mock.patch.object(torch, "compile", lambda fn: fn):  # its @torch.compile: eager here
        spec.loader.exec_module(module)
    return module.MultiheadFlashDiffV2


def rel_pos_f64(n, d, base=10000.0):
    """(cos, sin) tables (N, d/2), angle p · base^(−2m/d), written here independently of the library."""
    ang = torch.tensor([[p * base ** (-2 * m / d) for m in range(d // 2)] for p in range(n)], dtype=F64)
    return ang.cos(), ang.sin()


def randomize_(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * p.shape[-1] ** -0.5)
    return module


# D, h, h_kv, d: head_dim ≠ D/h, grouped K/V, h_kv = 1, head_dim = D/h
SIZES = [(24, 4, 2, 8), (32, 4, 4, 8), (20, 2, 1, 6), (48, 6, 3, 4)]


@pytest.mark.parametrize("D,h,hkv,d", SIZES)
@pytest.mark.parametrize("rope", ["interleaved", "half"])
def test_unilm_v2_to_diffattn_matches_official_float64(D, h, hkv, d, rope):
    Official = load_official()
    official = randomize_(Official(True, D, h, hkv, d).double(), seed=D + h)
    ours = from_unilm_v2(official, rope=rope)
    assert isinstance(ours, DiffAttentionV2) and ours.head_dim == d and ours.q_proj.weight.dtype == F64
    assert (ours.q_proj.out_features, ours.k_proj.out_features, ours.out_proj.in_features) == (2 * h * d, hkv * d,
                                                                                                h * d)
    x = torch.randn(2, 9, D, dtype=F64, generator=torch.Generator().manual_seed(1))
    ref = official(x, rel_pos_f64(9, d))
    out = ours(x)
    assert (out - ref).abs().max().item() <= 1e-12
    # the converted layer still decodes with a KV cache: token by token equals the full pass
    from diffattn import KVCache

    cache = KVCache()
    steps = torch.cat([ours(x[:, t:t + 1], kv_cache=cache) for t in range(9)], dim=1)
    assert (steps - ref).abs().max().item() <= 1e-12


@pytest.mark.parametrize("D,h,hkv,d", SIZES[:2])
@pytest.mark.parametrize("rope", ["interleaved", "half"])
def test_diffattn_to_unilm_v2_loads_strictly_and_matches_float64(D, h, hkv, d, rope):
    torch.manual_seed(0)
    ours = randomize_(DiffAttentionV2(D, h, num_kv_heads=hkv, head_dim=d, qkv_bias=False, out_bias=False,
                                      causal=True, rope=rope).double(), seed=3)
    args, sd = to_unilm_v2_state_dict(ours)
    assert args == dict(use_diff_v2=True, d_model=D, num_heads=h, num_kv_heads=hkv, head_dim=d)
    official = load_official()(**args).double()
    official.load_state_dict(sd, strict=True)
    x = torch.randn(3, 7, D, dtype=F64)
    assert (official(x, rel_pos_f64(7, d)) - ours(x)).abs().max().item() <= 1e-12
    # and back: the round trip gives the same tensors, bit for bit
    back = from_unilm_v2(official, rope=rope)
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_half_layout_checkpoint_and_rel_pos():
    """A checkpoint written for a GPT-NeoX-style rotary call (unilm_rope="half") converts to both layouts; the
    library's rel_pos tables equal the independent ones."""
    D, h, hkv, d = 24, 4, 2, 8
    official = randomize_(load_official("half")(True, D, h, hkv, d).double(), seed=5)
    x = torch.randn(2, 6, D, dtype=F64)
    ref = official(x, rel_pos_f64(6, d))
    for rope in ("half", "interleaved"):
        sd = unilm_v2_to_diffattn_state_dict(official.state_dict(), rope=rope, unilm_rope="half")
        ours = DiffAttentionV2(D, h, num_kv_heads=hkv, head_dim=d, qkv_bias=False, out_bias=False, causal=True,
                               rope=rope).double()
        ours.load_state_dict(sd, strict=True)
        assert (ours(x) - ref).abs().max().item() <= 1e-12
    cos, sin = unilm_rel_pos(6, d, dtype=F64)
    ref_cos, ref_sin = rel_pos_f64(6, d)
    assert (cos - ref_cos).abs().max().item() <= 1e-15 and (sin - ref_sin).abs().max().item() <= 1e-15


def test_permutations_are_inverse_and_documented():
    p = interleaved_to_half_perm(8)
    assert p.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert half_to_interleaved_perm(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert torch.equal(p[half_to_interleaved_perm(8)], torch.arange(8))
    with pytest.raises(ValueError, match="even integer"):
        interleaved_to_half_perm(7)


def test_prefixed_state_dicts_and_other_keys_pass_through():
    Official = load_official()
    blocks = {f"layers.{i}.attn.{k}": v for i in range(2)
              for k, v in randomize_(Official(True, 16, 2, 2, 8).double(), seed=i).state_dict().items()}
    blocks["layers.0.norm.weight"] = torch.ones(16, dtype=F64)
    ours = unilm_v2_to_diffattn_state_dict(blocks, rope="half")
    assert "layers.1.attn.out_proj.weight" in ours and "layers.1.attn.lambda_fn.lambda_proj.weight" in ours
    assert "layers.0.attn.o_proj.weight" not in ours and torch.equal(ours["layers.0.norm.weight"], torch.ones(16))
    back = diffattn_to_unilm_v2_state_dict(ours, rope="half")
    assert back.keys() == blocks.keys() and all(torch.equal(back[k], blocks[k]) for k in blocks)


def test_refusals_name_the_reason():
    with pytest.raises(ValueError, match="no 'lambda_proj.weight'"):
        unilm_v2_to_diffattn_state_dict({"q_proj.weight": torch.zeros(4, 4)})
    sd = load_official()(True, 16, 2, 2, 8).state_dict()
    with pytest.raises(ValueError, match=r"cannot express exactly: \['q_proj.bias'\]"):
        unilm_v2_to_diffattn_state_dict({**sd, "q_proj.bias": torch.zeros(32)})
    with pytest.raises(ValueError, match="divisible by num_kv_heads"):
        from_unilm_v2(load_official()(True, 24, 3, 2, 8).state_dict())  # 2h = 6 query heads in 2 groups of 3
    for kwargs, why in ((dict(sub_norm=True), "sub-norm"), (dict(causal=False), "causal=False"),
                        (dict(rope=None), "rope=None"), (dict(lambda_form="constant"), "lambda_form")):
        layer = DiffAttentionV2(16, 2, qkv_bias=False, out_bias=False, **{"causal": True, "rope": "interleaved",
                                                                           **kwargs})
        with pytest.raises(ValueError, match=why):
            to_unilm_v2_state_dict(layer)
    biased = DiffAttentionV2(16, 2, causal=True, rope="interleaved")  # qkv_bias: zero biases are dropped …
    with torch.no_grad():
        for m in (biased.q_proj, biased.k_proj, biased.v_proj, biased.out_proj):
            m.bias.zero_()
    assert "q_proj.bias" not in to_unilm_v2_state_dict(biased)[1]
    with torch.no_grad():
        biased.k_proj.bias[0] = 1.0  # … any other bias cannot be written
    with pytest.raises(ValueError, match="k_proj.bias is not zero"):
        to_unilm_v2_state_dict(biased)


def test_head_dim_argument():
    m = DiffAttentionV2(24, 4, num_kv_heads=2, head_dim=10)
    assert (m.head_dim, m.scale) == (10, 10**-0.5)
    assert tuple(m.q_proj.weight.shape) == (80, 24) and tuple(m.out_proj.weight.shape) == (24, 40)
    assert m(torch.randn(2, 5, 24)).shape == (2, 5, 24)
    assert math.isclose(DiffAttentionV2(24, 4).head_dim, 6)  # default dim / num_heads
    with pytest.raises(ValueError, match="head_dim must be None or an integer >= 1"):
        DiffAttentionV2(24, 4, head_dim=0)
    DiffAttentionV2(30, 4, head_dim=8)  # dim need not be divisible by num_heads when head_dim is given
    with pytest.raises(ValueError, match="divisible by num_heads"):
        DiffAttentionV2(30, 4)
