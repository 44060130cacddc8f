"""Causal LMs: registry, attention switch, save/load, KV cache, generate, DiffLlama export/import parity."""

import pytest
import torch
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

import diffattn
from diffattn.convert import from_diffllama, to_diffllama
from diffattn.models import create_model, from_pretrained, list_models
from diffattn.models.causal_lm import CausalLM

TINY = dict(vocab_size=64, dim=32, depth=2, num_heads=4)


def _tiny(attention="diff", **kw):
    return CausalLM(**{**TINY, "attention": attention, **kw})


def test_registry_names_build_forward_backward():
    names = list_models("*lm_*")
    assert {"lm_tiny", "diff_lm_tiny", "dg_lm_tiny", "lm_small", "diff_lm_base", "dg_lm_base"} <= set(names)
    ids = torch.randint(0, 64, (2, 5))
    for name in names:
        m = create_model(name, **TINY)
        assert m.model_name == name
        logits = m(ids)
        assert logits.shape == (2, 5, 64)
        logits.logsumexp(-1).mean().backward()
        assert all(p.grad is not None for p in m.parameters() if p.requires_grad), name
    assert create_model("diff_lm_tiny").blocks[1].attn.lambda_init == pytest.approx(0.8 - 0.6 * 0.7408182, 1e-6)


def test_attention_switch_changes_only_attention():
    shapes = {}
    for att in ("standard", "diff", "gated"):
        m = _tiny(att, num_kv_heads=2)
        shapes[att] = {k: v.shape for k, v in m.state_dict().items() if ".attn." not in k}
        assert type(m.blocks[0].attn).__name__ == {"standard": "Attention", "diff": "DiffAttention",
                                                   "gated": "GatedDiffAttention"}[att]
    assert shapes["standard"] == shapes["diff"] == shapes["gated"]
    std, diff = _tiny("standard", num_kv_heads=2), _tiny("diff", num_kv_heads=2)
    extra = sum(p.numel() for p in diff.parameters()) - sum(p.numel() for p in std.parameters())
    assert extra == 2 * (4 * 8 + 2 * 8)  # per layer: 4d λ values + the 2d sub-norm weight (d = 8)


@pytest.mark.parametrize("tie", [False, True])
def test_save_load_round_trip_exact(tmp_path, tie):
    m = create_model("diff_lm_tiny", **TINY, tie_embeddings=tie, diff_norm_affine=False, num_kv_heads=2).eval()
    m.save_pretrained(tmp_path)
    m2 = from_pretrained(tmp_path).eval()
    assert type(m2) is CausalLM and m2.model_name == "diff_lm_tiny" and m2.tie_embeddings is tie
    sd, sd2 = m.state_dict(), m2.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert (m2.lm_head.weight is m2.tok_embed.weight) is tie
    ids = torch.randint(0, 64, (1, 6))
    assert torch.equal(m(ids), m2(ids))


@pytest.mark.parametrize("attention", ["standard", "diff", "gated"])
def test_kv_cache_decode_equals_full_forward(attention):
    m = _tiny(attention, num_kv_heads=2).eval()
    ids = torch.randint(0, 64, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding in row 1
    with torch.no_grad():
        full = m(ids, mask)
        caches = m.new_kv_caches()
        steps = [m(ids[:, :4], mask[:, :4], caches)]
        for t in range(4, 9):
            steps.append(m(ids[:, t:t + 1], mask[:, :t + 1], caches))
    inc = torch.cat(steps, dim=1)
    assert caches[0].length == 9
    real = mask.bool()
    assert (inc - full)[real].abs().max().item() <= 1e-5


@pytest.mark.parametrize("attention", ["standard", "diff", "gated"])
def test_generate_cache_equals_no_cache(attention):
    m = _tiny(attention).eval()
    prompt = torch.randint(0, 64, (2, 5))
    g1 = m.generate(prompt, 6)
    g2 = m.generate(prompt, 6, use_cache=False)
    assert g1.shape == (2, 11) and torch.equal(g1, g2) and torch.equal(g1[:, :5], prompt)
    # greedy = argmax of the full forward at each step
    with torch.no_grad():
        assert torch.equal(m(g1[:, :-1])[:, 4:].argmax(-1), g1[:, 5:])
    s1 = m.generate(prompt, 6, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(1))
    s2 = m.generate(prompt, 6, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(1),
                    use_cache=False)
    assert torch.equal(s1, s2)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, :2] = 0
    p1 = m.generate(prompt, 4, attention_mask=mask)
    p2 = m.generate(prompt, 4, attention_mask=mask, use_cache=False)
    assert torch.equal(p1, p2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate(prompt, -1)


def _hf_tiny(**kw):
    cfg = DiffLlamaConfig(**{**dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                                    max_position_embeddings=128,
                                    rope_parameters={"rope_type": "default", "rope_theta": 1000.0}), **kw})
    hf = DiffLlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norm weights away from ones so that the mapping of every tensor is tested
        for n, p in hf.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif n.endswith(".bias"):
                p.normal_()
    return hf


@pytest.mark.parametrize("kw", [{}, {"attention_bias": True, "tie_word_embeddings": True},
                                {"num_key_value_heads": 4}])
def test_diffllama_import_export_parity(kw):
    hf = _hf_tiny(**kw)
    ids = torch.randint(0, 64, (2, 10))
    ours = from_diffllama(hf).eval()
    assert ours.attention == "diff" and ours.tie_embeddings == hf.config.tie_word_embeddings
    assert not ours.blocks[0].attn.diff_norm.elementwise_affine and ours.blocks[0].attn.diff_norm.eps == 1e-6
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= 1e-5
        back = to_diffllama(ours).eval()
        assert (back(ids).logits - ref).abs().max().item() <= 1e-5
    sd, sd2 = hf.state_dict(), back.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)


def test_a_diffllama_export_written_to_a_folder_is_what_transformers_and_diffattn_load(tmp_path):
    """The serving hand-off of docs/released-models.md: ``to_diffllama(model).save_pretrained(folder)`` is a folder
    transformers' DiffLlamaForCausalLM loads with the model's logits, and that diffattn reads back bit-identically
    (from_diffllama, and factory.load_released, what ``diffattn inspect`` uses)."""
    from diffattn.factory import load_released

    m = _tiny("diff", num_kv_heads=2, lambda_init="ye", norm_eps=1e-6, diff_norm_eps=1e-6).eval()
    ids = torch.randint(0, 64, (2, 9))
    to_diffllama(m, fold_norm=True).save_pretrained(tmp_path / "dl")
    hf = DiffLlamaForCausalLM.from_pretrained(tmp_path / "dl").eval()
    with torch.no_grad():
        ref = m(ids)
        assert (hf(ids).logits - ref).abs().max().item() <= 1e-5
        for back in (from_diffllama(str(tmp_path / "dl")), load_released(tmp_path / "dl")[0]):
            assert type(back) is CausalLM and not back.training
            assert torch.equal(back(ids), from_diffllama(hf)(ids))


def test_diffllama_export_from_scratch_and_refusals():
    ids = torch.randint(0, 64, (2, 7))
    m = _tiny("diff", num_kv_heads=2, lambda_init="ye", norm_eps=1e-6, diff_norm_eps=1e-6).eval()
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.diff_norm.weight.uniform_(0.5, 1.5)
    with pytest.raises(ValueError, match="fold_norm"):
        to_diffllama(m)
    hf = to_diffllama(m, fold_norm=True).eval()
    with torch.no_grad():
        assert (hf(ids).logits - m(ids)).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="attention='standard'"):
        to_diffllama(_tiny("standard"))
    with pytest.raises(ValueError, match="lambda_init"):
        to_diffllama(_tiny("diff", lambda_init=0.8, diff_norm_eps=1e-5))
    with pytest.raises(ValueError, match="rms_norm_eps"):
        to_diffllama(_tiny("diff", diff_norm_eps=1e-6))
    with pytest.raises(ValueError, match="input_ids"):
        m(torch.randn(2, 3))
    with pytest.raises(ValueError, match="attention_mask"):
        m(ids, torch.ones(2, 3))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_diffllama_model_converters_keep_the_source_dtype(dtype):
    """from_diffllama / to_diffllama return a model of the source's dtype with bit-identical tensors (the 0.1.0
    converters always returned float32: float64 rounded, bf16 upcast)."""
    hf = _hf_tiny(tie_word_embeddings=True).to(dtype)
    ours = from_diffllama(hf).eval()
    assert {p.dtype for p in ours.parameters()} == {dtype}
    assert ours.lm_head.weight is ours.tok_embed.weight  # the tie survives
    q_hf = hf.model.layers[1].self_attn.q_proj.weight
    perm = diffattn.convert.halves_to_adjacent_perm(4)
    assert torch.equal(ours.blocks[1].attn.q_proj.weight, diffattn.convert.permute_heads(q_hf, perm, 8))
    back = to_diffllama(ours).eval()
    assert {p.dtype for p in back.parameters()} == {dtype}
    sd, sd2 = hf.state_dict(), back.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    if dtype == torch.float64:  # transformers computes RoPE tables in float32, hence 1e-6 rather than 1e-12
        ids = torch.randint(0, 64, (2, 9))
        with torch.no_grad():
            y = ours(ids)
            assert y.dtype == torch.float64 and (y - hf(ids).logits).abs().max().item() <= 1e-6


def test_diffllama_missing_or_empty_tensor_is_a_clear_error():
    with pytest.raises(ValueError, match=r"DiffLlama attention state dict has no 'q_proj.weight'"):
        diffattn.convert.diffllama_to_diffattn_state_dict({}, num_heads=4, num_kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="is empty"):
        diffattn.convert.diffllama_to_diffattn_state_dict(
            {"q_proj.weight": torch.zeros(0, 32)}, num_heads=4, num_kv_heads=2, head_dim=8)


def test_diff_v2_lm():
    """attention="diff_v2": DiffAttentionV2 layers (2h query heads, shared K/V, no sub-norm); cached decoding gives the
    same tokens as full recomputation; saves and loads exactly; λ_form and the sub-norm come from the constructor."""
    m = create_model("diff_v2_lm_tiny").eval()
    attn = m.blocks[0].attn
    assert type(attn).__name__ == "DiffAttentionV2" and attn.lambda_form == "token_sigmoid"
    assert attn.q_proj.weight.shape == (2 * 64, 64) and attn.k_proj.weight.shape == (2 * 16, 64)
    assert isinstance(attn.diff_norm, torch.nn.Identity)
    ids = torch.randint(0, 512, (2, 6))
    with torch.no_grad():
        a = m.generate(ids, 5, use_cache=True)
        b = m.generate(ids, 5, use_cache=False)
    assert torch.equal(a, b)
    diff = create_model("diff_lm_tiny", diff_norm_eps=1e-6, diff_norm_affine=False, lambda_form="constant")
    norm = diff.blocks[1].attn.diff_norm
    assert norm.eps == 1e-6 and not norm.elementwise_affine and diff.blocks[1].attn.lambda_form == "constant"
