"""A retrofitted transformers Llama decodes with transformers' static cache (``cache_implementation="static"``)
exactly as with its dynamic cache and without a cache, in float64, for methods that cache a second branch (DiffK's
keys, DiffV's values) and those that do not; its decode steps run the unpadded decode attention."""

import copy

import pytest
import torch
import transformers as T

import diffattn.adapters as A
from diffattn.ops import functional

LM = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          vocab_size=128, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _llama():
    torch.manual_seed(0)
    return T.LlamaForCausalLM._from_config(T.LlamaConfig(**LM), attn_implementation="sdpa").to(torch.float64).eval()


@pytest.mark.parametrize("method", ["daa", "diffk", "diffv", "split_heads"])
def test_static_cache_generates_like_dynamic(method, monkeypatch):
    model = A.retrofit(copy.deepcopy(_llama()), method, anneal_steps=10)
    for _, a in A.adapters(model):  # off the identity, so that the second branch matters
        for p in a.parameters():
            p.data.add_(0.3 * torch.randn(p.shape, dtype=p.dtype))
        a.advance(6)
    ids = torch.randint(1, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    am = torch.ones(2, 6, dtype=torch.long)
    am[0, :2] = 0  # left padding in row 0
    kw = dict(attention_mask=am, max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
    calls = []
    real = functional.decode_diff_attention
    monkeypatch.setattr(functional, "decode_diff_attention",
                        lambda *a, **k: calls.append(a[0].shape[2]) or real(*a, **k))
    static = model.generate(ids, cache_implementation="static", **kw)
    if method == "diffv":  # A (V1 − λ V2): one standard attention call, nothing to pad
        assert not calls
    else:  # the prompt (6 rows) and each decode step (1 row)
        assert calls.count(1) == 5 * LM["num_hidden_layers"] and set(calls) == {1, 6}
    dynamic = model.generate(ids, **kw)
    none = model.generate(ids, use_cache=False, **kw)
    assert torch.equal(static.sequences, dynamic.sequences) and torch.equal(static.sequences, none.sequences)
    for s, d in zip(static.scores, dynamic.scores):
        assert (s - d).abs().max().item() <= 1e-10
