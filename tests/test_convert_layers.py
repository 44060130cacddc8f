"""diffattn.convert: exact conversion to and from transformers' DiffLlama (halves) and timm DiffAttention."""

import pytest
import torch
from timm.layers import DiffAttention as TimmDiffAttention
from transformers import DiffLlamaConfig
from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention, DiffLlamaRotaryEmbedding

import diffattn
from diffattn import convert


def test_permutations_are_inverse_and_explicit():
    p = convert.halves_to_adjacent_perm(8)
    assert p.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    q = convert.adjacent_to_halves_perm(8)
    assert q.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert p[q].tolist() == list(range(8)) and q[p].tolist() == list(range(8))
    w = torch.arange(8 * 3).float().view(8 * 3, 1)  # 8 heads of width 3
    back = convert.permute_heads(convert.permute_heads(w, p, 3), q, 3)
    assert torch.equal(back, w)
    # adjacent head 1 = halves head 4
    assert convert.permute_heads(w, p, 3)[3:6, 0].tolist() == [12.0, 13.0, 14.0]
    with pytest.raises(ValueError, match="num_heads"):
        convert.halves_to_adjacent_perm(5)
    with pytest.raises(ValueError, match="head_dim=4"):
        convert.permute_heads(w, p, 4)


# ------------------------------------------------------------------------------------------------ timm


def _timm(dtype, dual=False, qkv_bias=True, depth=2):
    m = TimmDiffAttention(32, num_heads=2, qkv_bias=qkv_bias, depth=depth, dual_lambda=dual).eval()
    with torch.no_grad():
        m.sub_norm.weight.uniform_(0.5, 1.5)
        if dual:
            m.lambda_a.fill_(0.3)
            m.lambda_b.fill_(-0.2)
        elif dtype == torch.float64:
            # timm computes the reparam λ in float32 even in a float64 module (``.float()`` in
            # _compute_lambda), so for a 1e-10 comparison λ must be float32-exact: exp(λ_q·0) = 1, λ_init 0.75.
            m.lambda_k1.zero_()
            m.lambda_k2.zero_()
            m.lambda_init = 0.75
    return m.to(dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("dual", [False, True])
def test_timm_to_ours_and_back_parity(dtype, tol, dual):
    t = _timm(dtype, dual=dual)
    x = torch.randn(2, 7, 32, dtype=dtype)
    ours = convert.from_timm_diff_attention(t)
    assert isinstance(ours, diffattn.DiffAttention) and ours.num_heads == 4 and ours.head_dim == 8
    assert ours.lambda_form == ("dual_scalar" if dual else "reparam") and ours.lambda_init == t.lambda_init
    assert ours.q_proj.weight.dtype == dtype
    with torch.no_grad():
        ref = t(x)
        assert (ours(x) - ref).abs().max().item() <= tol
        mask = torch.rand(2, 1, 7, 7) > 0.3
        mask |= torch.eye(7, dtype=torch.bool)
        assert (ours(x, attn_mask=mask) - t(x, attn_mask=mask)).abs().max().item() <= tol
        assert (ours(x, is_causal=True) - t(x, is_causal=True)).abs().max().item() <= tol
        back = convert.to_timm_diff_attention(ours)
        assert (back(x) - ref).abs().max().item() <= tol
    sd0, sd1 = t.state_dict(), back.state_dict()
    assert sd0.keys() == sd1.keys() and all(torch.equal(sd0[k], sd1[k]) for k in sd0)


def test_ours_to_timm_parity_and_state_dict_round_trip():
    ours = diffattn.DiffAttention(32, 4, depth=3, lambda_init=0.75, qkv_bias=False).double().eval()
    with torch.no_grad():  # float32-exact λ (timm computes it in float32, see _timm)
        ours.diff_norm.weight.uniform_(0.5, 1.5)
        ours.lambda_k1.zero_()
        ours.lambda_k2.zero_()
    t = convert.to_timm_diff_attention(ours)
    assert t.num_heads == 2 and t.head_dim == 8 and t.qkv.bias is None and t.lambda_init == ours.lambda_init
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    with torch.no_grad():
        assert (t(x) - ours(x)).abs().max().item() <= 1e-10
    sd = ours.state_dict()
    rt = convert.timm_to_diffattn_state_dict(convert.diffattn_to_timm_state_dict(sd))
    assert rt.keys() == sd.keys() and all(torch.equal(rt[k], sd[k]) for k in sd)


def test_timm_refusals():
    with pytest.raises(ValueError, match="qk_norm"):
        convert.from_timm_diff_attention(TimmDiffAttention(32, num_heads=2, qk_norm=True))
    with pytest.raises(ValueError, match="num_kv_heads"):
        convert.to_timm_diff_attention(diffattn.DiffAttention(32, 4, num_kv_heads=2))
    with pytest.raises(ValueError, match="rotary"):
        convert.to_timm_diff_attention(diffattn.DiffAttention(32, 4, rope="half"))
    with pytest.raises(ValueError, match="not gated"):
        convert.to_timm_diff_attention(diffattn.GatedDiffAttention(32, 4))
    with pytest.raises(ValueError, match="cannot express"):
        convert.timm_to_diffattn_state_dict({"qkv.weight": torch.zeros(96, 32), "extra": torch.zeros(1)})


# ------------------------------------------------------------------------------------------- DiffLlama


def _cfg(**kw):
    base = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=4, intermediate_size=96,
                num_hidden_layers=3, vocab_size=61, rms_norm_eps=1e-6, max_position_embeddings=64,
                rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    base.update(kw)
    cfg = DiffLlamaConfig(**base)
    cfg._attn_implementation = "eager"
    return cfg


def _hf_forward(hf, cfg, x):
    n = x.shape[1]
    pos = torch.arange(n).unsqueeze(0)
    cos, sin = DiffLlamaRotaryEmbedding(cfg)(x, pos)
    mask = torch.full((n, n), torch.finfo(x.dtype).min).triu(1)[None, None]  # additive causal (1, 1, N, N)
    return hf(x, (cos, sin), attention_mask=mask)[0]


@pytest.mark.parametrize("kv,bias", [(4, False), (2, True), (8, False)])
def test_diffllama_attention_parity_both_directions(kv, bias):
    cfg = _cfg(num_key_value_heads=kv, attention_bias=bias)
    hf = DiffLlamaAttention(cfg, layer_idx=2).eval()
    with torch.no_grad():  # make the biases matter
        for p in hf.parameters():
            if p.dim() == 1 and not p.shape[0] == 8:
                p.normal_()
    x = torch.randn(2, 9, 64)
    ours = convert.from_diffllama_attention(hf)
    assert ours.num_heads == 8 and ours.num_kv_heads == kv and ours.causal and ours.rotary.style == "half"
    assert ours.lambda_init == pytest.approx(0.8 - 0.6 * torch.exp(torch.tensor(-0.6)).item())
    assert not ours.diff_norm.elementwise_affine and ours.diff_norm.eps == 1e-6
    with torch.no_grad():
        ref = _hf_forward(hf, cfg, x)
        assert (ours(x) - ref).abs().max().item() <= 1e-5
        back = convert.to_diffllama_attention(ours, cfg)
        assert (_hf_forward(back, cfg, x) - ref).abs().max().item() <= 1e-5
    sd0, sd1 = hf.state_dict(), back.state_dict()
    assert sd0.keys() == sd1.keys() and all(torch.equal(sd0[k], sd1[k]) for k in sd0)


def test_ours_to_diffllama_with_gqa_and_folded_norm():
    ours = diffattn.DiffAttention(64, 8, num_kv_heads=4, depth=1, lambda_init="ye", causal=True, rope="half",
                                  rope_theta=500.0, qkv_bias=False, out_bias=False).eval()
    ours.diff_norm.eps = 1e-6
    x = torch.randn(2, 6, 64)
    cfg = _cfg()
    hf = convert.to_diffllama_attention(ours)  # config built from the module
    assert hf.config.num_key_value_heads == 4 and hf.config.rms_norm_eps == 1e-6 and hf.layer_idx == 1
    with torch.no_grad():
        assert (_hf_forward(hf, cfg, x) - ours(x)).abs().max().item() <= 1e-5
        ours.diff_norm.weight.uniform_(0.5, 1.5)
    with pytest.raises(ValueError, match="fold_norm"):
        convert.to_diffllama_attention(ours)
    hf = convert.to_diffllama_attention(ours, fold_norm=True)
    with torch.no_grad():
        assert (_hf_forward(hf, cfg, x) - ours(x)).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="layer_idx"):
        convert.to_diffllama_attention(ours, layer_idx=4)
    with pytest.raises(ValueError, match="rope='half'"):
        convert.to_diffllama_attention(diffattn.DiffAttention(64, 8, rope="interleaved"))


def test_diffllama_state_dict_round_trip_exact():
    hf = DiffLlamaAttention(_cfg(attention_bias=True), layer_idx=0)
    sd = hf.state_dict()
    ours = convert.diffllama_to_diffattn_state_dict(sd, num_heads=8, num_kv_heads=4, head_dim=8,
                                                    diff_norm_affine=True)
    assert torch.equal(ours["diff_norm.weight"], torch.ones(16))
    # adjacent head 1 is halves head 4 (branch 2 of differential head 0)
    assert torch.equal(ours["q_proj.weight"][8:16], sd["q_proj.weight"][32:40])
    assert torch.equal(ours["v_proj.weight"][8:16], sd["v_proj.weight"][16:24])
    back = convert.diffattn_to_diffllama_state_dict(ours, num_heads=8, num_kv_heads=4, head_dim=8)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    again = convert.diffllama_to_diffattn_state_dict(back, num_heads=8, num_kv_heads=4, head_dim=8,
                                                     diff_norm_affine=True)
    assert all(torch.equal(again[k], ours[k]) for k in ours)
