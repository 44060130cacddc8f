"""The static KV cache: the same outputs as the dynamic cache and the full forward for every layer kind (float64),
no copy of the past per step, its errors, and ``generate(cache=...)``."""

from __future__ import annotations

import pytest
import torch

import diffattn
from diffattn.layers import Attention, DiffAttention, DiffAttentionV2, GatedDiffAttention, KVCache, StaticKVCache

from .reference import F64

LAYERS = [Attention, DiffAttention, DiffAttentionV2, GatedDiffAttention]


def _decode(m, x, cache, prefill=5):
    steps = [m(x[:, :prefill], kv_cache=cache)]
    for t in range(prefill, x.shape[1]):
        steps.append(m(x[:, t:t + 1], kv_cache=cache))
    return torch.cat(steps, 1)


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_static_equals_dynamic_and_full_forward_float64(cls, num_kv_heads):
    torch.manual_seed(0)
    m = cls(32, 4, num_kv_heads=num_kv_heads, causal=True, rope="half").to(F64).eval()
    x = torch.randn(2, 11, 32, dtype=F64)
    with torch.no_grad():
        full = m(x)
        static, dynamic = StaticKVCache(16), KVCache()
        s, d = _decode(m, x, static), _decode(m, x, dynamic)
    assert static.length == dynamic.length == 11
    assert torch.equal(static.k[:, :, :11], dynamic.k) and torch.equal(static.v[:, :, :11], dynamic.v)
    assert (s - d).abs().max().item() <= 1e-12
    assert (s - full).abs().max().item() <= 1e-10


def test_static_cache_writes_in_place():
    """The buffers are allocated once; an update writes n positions and returns views of the first ``length``."""
    c = StaticKVCache(8)
    k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 3, 16)
    kk, vv = c.update(k, v)
    buf_k, buf_v = c.k, c.v
    assert buf_k.shape == (2, 4, 8, 8) and buf_v.shape == (2, 2, 8, 16)
    assert torch.equal(kk, k) and torch.equal(vv, v) and c.length == 3
    k1, v1 = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 1, 16)
    kk, vv = c.update(k1, v1)
    assert c.k is buf_k and c.v is buf_v  # no new buffer
    assert kk.data_ptr() == buf_k.data_ptr() and kk.shape == (2, 4, 4, 8)
    assert torch.equal(kk[:, :, 3:], k1) and torch.equal(vv[:, :, :3], v)
    c.crop(2)
    assert c.length == 2 and c.update(k1, v1)[0].shape[2] == 3
    c.reorder(torch.tensor([1]))
    assert c.k.shape[0] == 1 and torch.equal(c.k[0, :, 2:3], k1[1])
    c.reset()
    assert c.length == 0


def test_static_cache_errors_name_the_argument():
    with pytest.raises(ValueError, match="max_length must be an integer >= 1, got 0"):
        StaticKVCache(0)
    c = StaticKVCache(4)
    c.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    with pytest.raises(ValueError, match="max_length=4 positions; 3 are cached and 2 more do not fit"):
        c.update(torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8))
    with pytest.raises(ValueError, match="do not extend the cache"):
        c.update(torch.randn(1, 3, 1, 8), torch.randn(1, 2, 1, 8))
    with pytest.raises(ValueError, match=r"length must be an integer in \[0, 3\]"):
        c.crop(5)


@pytest.mark.parametrize("name", ["lm_tiny", "diff_lm_tiny", "dg_lm_tiny", "diff_v2_lm_tiny"])
def test_generate_static_equals_dynamic_and_no_cache(name):
    torch.manual_seed(0)
    m = diffattn.create_model(name).to(F64).eval()
    ids = torch.randint(0, 512, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    static = m.generate(ids, 10, attention_mask=mask)  # the default
    assert torch.equal(static, m.generate(ids, 10, attention_mask=mask, cache="dynamic"))
    assert torch.equal(static, m.generate(ids, 10, attention_mask=mask, use_cache=False))
    with torch.no_grad():
        caches = m.new_kv_caches(max_length=20)
        logits_s = m(ids, mask, caches)
        logits_d = m(ids, mask, m.new_kv_caches())
    assert all(isinstance(c, StaticKVCache) and c.max_length == 20 for c in caches)
    assert (logits_s - logits_d).abs().max().item() <= 1e-12
    with pytest.raises(ValueError, match="cache must be one of"):
        m.generate(ids, 2, cache="paged")


def test_static_cache_under_torch_compile():
    """A compiled decoding step (graph capture with the ``eager`` backend, no compiler needed) reads and writes the
    static cache like the uncompiled step."""
    torch.manual_seed(0)
    m = diffattn.create_model("diff_lm_tiny").eval()
    ids = torch.randint(0, 512, (1, 6))
    step = torch.compile(m, backend="eager", dynamic=True)
    with torch.no_grad():
        ref_c, cmp_c = m.new_kv_caches(max_length=12), m.new_kv_caches(max_length=12)
        ref, out = [m(ids, kv_caches=ref_c)], [step(ids, kv_caches=cmp_c)]
        for _ in range(4):
            tok = ref[-1][:, -1:].argmax(-1)
            ref.append(m(tok, kv_caches=ref_c))
            out.append(step(tok, kv_caches=cmp_c))
    assert cmp_c[0].length == 10
    for a, b in zip(ref, out):
        assert (a - b).abs().max().item() <= 1e-5
