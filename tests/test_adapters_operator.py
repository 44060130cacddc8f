"""Retrofits compute through the operator (diffattn.ops.functional): the calls are observable, and left-padded batches
are exact at step 0 in every dtype and attention implementation (a float64 model stays float64 throughout)."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T

import diffattn.adapters as A
import diffattn.ops.functional as DF

LM = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          vocab_size=128, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def build(family: str, impl: str, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0,
                           eos_token_id=0)
        m = T.GPT2LMHeadModel._from_config(cfg, attn_implementation=impl)
    else:
        m = T.LlamaForCausalLM._from_config(T.LlamaConfig(**LM), attn_implementation=impl)  # GQA: 4 q / 2 kv heads
    return m.to(dtype).eval()


def left_padded():
    ids = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    am = torch.ones(2, 9, dtype=torch.long)
    am[0, :3] = 0
    return ids, am


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_retrofit_calls_the_operator(family, impl, monkeypatch):
    calls = {"diff_attention": 0, "attention": 0}
    for name in calls:
        real = getattr(DF, name)

        def spy(*args, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(DF, name, spy)
    ids, am = left_padded()
    for method, op in (("daa", "diff_attention"), ("diffk", "diff_attention"), ("dex", "attention"),
                       ("diffv", "attention"), ("split_heads", "diff_attention")):
        model = A.retrofit(build(family, impl), method)
        before = dict(calls)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=am)
        assert calls[op] - before[op] >= 2, (method, calls)  # one call per layer at least


TOL = {torch.float64: 1e-13, torch.float32: 1e-6, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_left_padded_batch_is_exact_at_step0(family, impl, dtype):
    """Left padding under a causal mask fully masks the padded query rows; every retrofit method must reproduce the
    pretrained logits at every real position, with no NaN anywhere (a float64 eager model used to give NaN).

    The float64 reference is the SDPA model (float64 throughout): transformers' eager Llama runs its softmax in
    float32, so it is only float32-accurate, and its padded rows are NaN in float64."""
    ids, am = left_padded()
    keep = am.bool()
    base = build(family, impl, dtype)
    ref_model = build(family, "sdpa", dtype) if dtype == torch.float64 else base
    with torch.no_grad():
        ref = ref_model(input_ids=ids, attention_mask=am).logits
    for method in A.METHODS:
        model = A.retrofit(copy.deepcopy(base), method)
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=am).logits
        assert got.dtype == dtype
        assert bool(got.isfinite().all()), method
        err = (got[keep].double() - ref[keep].double()).abs().max().item()
        assert err <= TOL[dtype], (method, err)


@pytest.mark.parametrize("method", ["daa", "dex", "diffq", "split_heads"])
def test_float64_model_stays_float64(method):
    """Off identity, a float64 retrofitted GPT-2 under eager and SDPA agree to float64 precision: nothing in the
    path (λ, maps, masks) runs in float32."""
    ids, am = left_padded()
    e = A.retrofit(build("gpt2", "eager", torch.float64), method, anneal_steps=10)
    g = torch.Generator().manual_seed(2)
    for _, a in A.adapters(e):
        for p in a.parameters():
            p.data.add_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        a.advance(4)
        assert a.lambda_value().dtype == torch.float64
    s = A.retrofit(build("gpt2", "sdpa", torch.float64), method, anneal_steps=10)
    s.load_state_dict(e.state_dict())
    with torch.no_grad():
        ye, ys = e(input_ids=ids, attention_mask=am).logits, s(input_ids=ids, attention_mask=am).logits
        y0 = build("gpt2", "sdpa", torch.float64)(input_ids=ids, attention_mask=am).logits
    keep = am.bool()
    assert (ye[keep] - ys[keep]).abs().max().item() < 1e-12
    assert (ye[keep] - y0[keep]).abs().max().item() > 1e-4  # and the adapters do matter


def test_timm_and_open_clip_padding_masks_float64():
    """timm (bool key-padding attn_mask) and open_clip (key_padding_mask) in float64: exact at step 0."""
    import open_clip
    import timm

    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=2,
                                                           num_heads=4, num_classes=5).double().eval()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    keep[0, ..., 4:] = False
    clip = open_clip.CLIP(embed_dim=16, vision_cfg={"image_size": 16, "layers": 2, "width": 32, "patch_size": 8,
                                                    "head_width": 8},
                          text_cfg={"context_length": 8, "vocab_size": 64, "width": 32, "heads": 4,
                                    "layers": 2}).double().eval()
    blk = clip.transformer.resblocks[0]
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 5:] = True
    with torch.no_grad():
        ref_t = vit.blocks[0].attn(x, attn_mask=keep)
        ref_c = blk.attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]
    for method in A.METHODS:
        v = A.retrofit(copy.deepcopy(vit), method)
        c = A.retrofit(copy.deepcopy(clip), method)
        with torch.no_grad():
            got_t = v.blocks[0].attn(x, attn_mask=keep)
            got_c = c.transformer.resblocks[0].attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        assert (got_t - ref_t).abs().max().item() < 1e-13, method
        assert (got_c - ref_c).abs().max().item() < 1e-13, method
