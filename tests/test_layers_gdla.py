"""Grouped differential latent attention (Motif-3): exact against a float64 transcription of llama.cpp's graph
(``tests/reference_motif3.py``), with and without the gate, full and sliding-window layers, GQA and two group
ratios, YaRN on the full layers; the latent cache decodes what the full forward computes; the kind runs through a
model, its save and load, the logit diagnostics and ``inspect``."""

from __future__ import annotations

import math

import pytest
import torch

import diffattn
from diffattn.convert.motif3 import from_motif3_attention
from diffattn.diagnostics import capture_logits, logit_layers
from diffattn.layers import ATTENTION_TYPES, AttentionSpec, GroupedLatentDiffAttention, KVCache, StaticKVCache
from diffattn.layers.rope import RotaryEmbedding, YarnRotaryEmbedding
from diffattn.layers.spec import HEAD_LAYOUTS, attention_kind

from .reference_motif3 import motif3_attention_reference

TOL = dict(rtol=0.0, atol=1e-10)

# (n_head, n_noise, n_head_kv): 4:1 with one KV head per group, 4:1 with KV heads straddling the groups
# (each group's signal and noise heads read different KV heads), 2:1 with one KV head for all, 4:1 as MHA
CONFIGS = [(10, 2, 2), (10, 2, 5), (9, 3, 1), (5, 1, 5)]


def motif3_config(n_head: int, n_noise: int, n_kv: int, *, swa: bool = True) -> dict:
    return {"hidden_size": 48, "num_attention_heads": n_head, "num_noise_heads": n_noise, "num_key_value_heads": n_kv,
            "q_lora_rank": 24, "kv_lora_rank": 16, "head_dim": 10, "qk_rope_head_dim": 4, "v_head_dim": 6,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "swa_rope_theta": 500.0, "use_sliding_window": swa,
            "sliding_window": 3, "sliding_window_pattern": "interleave", "sliding_window_period": 2}


def yarn_config(cfg: dict, *, mscale: float = 1.0) -> dict:
    """``cfg`` with YaRN (factor 4 over 4096 positions) and RoPE widths that put pairs on the ramp: d_rope = 12 has
    correction dims (1, 5), so the pairs are kept, kept, ¾, ½, ¼ and 0 extrapolated."""
    return {**cfg, "head_dim": 18, "qk_rope_head_dim": 12,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                             "beta_fast": 32, "beta_slow": 1, "mscale": mscale}}


def released_weights(cfg: dict, layer: int, *, gate: bool = True, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float64 tensors under the released names of layer ``layer``."""
    g = torch.Generator().manual_seed(seed)
    h, hn, hkv = cfg["num_attention_heads"], cfg["num_noise_heads"], cfg["num_key_value_heads"]
    e, rq, rkv, dk, dr, dv = (cfg[k] for k in ("hidden_size", "q_lora_rank", "kv_lora_rank", "head_dim",
                                               "qk_rope_head_dim", "v_head_dim"))
    shapes = {"wq_a": (rq, e), "q_norm": (rq,), "wq_b": (h * dk, rq), "wq_b_gate": ((h - hn) * dv, rq),
              "wkv_a": (rkv + dr, e), "kv_norm": (rkv,), "wkv_b": (hkv * (dk - dr + dv), rkv),
              "lambda_proj": (h - hn, e), "wo": (e, (h - hn) * dv)}
    if not gate:
        del shapes["wq_b_gate"]
    out = {}
    for name, shape in shapes.items():
        t = torch.randn(*shape, generator=g, dtype=torch.float64)
        out[f"model.layers.{layer}.self_attn.{name}.weight"] = (1 + 0.1 * t) if "norm" in name else t * 0.3
    return out


def reference(cfg, sd, layer, x, **kw):
    p = f"model.layers.{layer}.self_attn."
    w = {k[len(p):-len(".weight")]: v for k, v in sd.items() if k.startswith(p)}
    swa = layer % cfg["sliding_window_period"] != 0 and cfg["use_sliding_window"]
    hp = dict(n_head=cfg["num_attention_heads"], n_head_kv=cfg["num_key_value_heads"], n_noise=cfg["num_noise_heads"],
              kv_lora_rank=cfg["kv_lora_rank"], nope=cfg["head_dim"] - cfg["qk_rope_head_dim"],
              rope=cfg["qk_rope_head_dim"], v=cfg["v_head_dim"], eps=cfg["rms_norm_eps"],
              rope_theta=cfg["swa_rope_theta"] if swa else cfg["rope_theta"])
    if "rope_scaling" in cfg:
        y = cfg["rope_scaling"]
        hp["yarn"] = dict(factor=y["factor"], n_ctx_orig=y["original_max_position_embeddings"],
                          beta_fast=y["beta_fast"], beta_slow=y["beta_slow"], mscale=y["mscale"])
    return motif3_attention_reference(w, x, hp, n_swa=cfg["sliding_window"] + 1 if swa else None, **kw)


# ------------------------------------------------------------------------------------------- the kind's unit

def test_the_kind_is_registered_and_its_class_answers_for_it():
    cls = ATTENTION_TYPES["gdla"]
    assert cls is GroupedLatentDiffAttention and cls.differential and cls.head_layout in HEAD_LAYOUTS
    spec = AttentionSpec("gdla")
    assert type(spec) is cls.Config and spec.causal and spec.rope == "half" and not spec.qkv_bias
    layer = spec.build(80, 10)
    assert type(layer) is cls and attention_kind(layer) == "gdla" and layer.config == spec
    assert (layer.num_signal_heads, layer.num_noise_heads, layer.num_kv_heads, layer.group_ratio) == (8, 2, 2, 4)
    assert AttentionSpec.from_dict(spec.to_dict()) == spec
    assert spec.updated({"kind": "grouped"}).kind == "grouped"
    with pytest.raises(ValueError, match="GroupedLatentDiffAttention takes a config of attention kind 'gdla'"):
        cls(80, 10, AttentionSpec("diff"))


@pytest.mark.parametrize("settings, message", [
    (dict(q_lora_rank=0), "attention q_lora_rank must be None or an integer >= 1, got 0"),
    (dict(qk_rope_head_dim=3), "attention qk_rope_head_dim must be even"),
    (dict(output_gate=1), "attention output_gate must be a bool, got 1"),
    (dict(qkv_bias=True), "attention 'gdla' has no biases .*qkv_bias must be False"),
    (dict(rope=None), "rope must be 'half' or 'interleaved', got None"),
    (dict(norm_eps=0.0), "attention norm_eps must be a finite float > 0"),
    (dict(yarn_factor=0.5), "attention yarn_factor must be >= 1"),
    (dict(yarn_factor=2.0), "attention yarn_factor=2.0 needs yarn_original_context"),
    (dict(yarn_mscale=-1.0), "attention yarn_mscale must be a finite float >= 0, got -1.0"),
    (dict(yarn_original_context=0), "attention yarn_original_context must be None or an integer >= 1, got 0"),
])
def test_bad_settings_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        AttentionSpec("gdla", **settings)


@pytest.mark.parametrize("num_heads, settings, message", [
    (8, {}, r"num_heads=8 needs num_noise_heads \(the default, num_heads / 5"),
    (10, dict(num_noise_heads=4), r"signal heads \(.* = 6\) must be a positive multiple of num_noise_heads=4"),
    (10, dict(num_kv_heads=4), "num_heads=10 must be divisible by num_kv_heads=4"),
])
def test_head_splits_that_do_not_fit_are_refused(num_heads, settings, message):
    with pytest.raises(ValueError, match=message):
        AttentionSpec("gdla", **settings).build(80, num_heads)


# ---------------------------------------------------------------------------------------- parity with llama.cpp

@pytest.mark.parametrize("heads", CONFIGS)
@pytest.mark.parametrize("layer", [0, 1], ids=["full", "swa"])
@pytest.mark.parametrize("gate", [True, False], ids=["gate", "no_gate"])
def test_matches_the_llama_cpp_graph_in_float64(heads, layer, gate):
    cfg = motif3_config(*heads)
    sd = released_weights(cfg, layer, gate=gate)
    attn = from_motif3_attention(cfg, sd, layer).eval()
    assert (attn.gate_proj is not None) == gate and (attn.sliding_window == 4) == (layer == 1)
    assert attn.shares_kv == (heads[2] in (2, 1)) and attn.rotary.base == (500.0 if layer else 10000.0)
    x = torch.randn(2, 9, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = attn(x)
    for b in range(2):
        torch.testing.assert_close(out[b], reference(cfg, sd, layer, x[b]), **TOL)


@pytest.mark.parametrize("heads", CONFIGS[:2])
@pytest.mark.parametrize("layer", [0, 1], ids=["full", "swa"])
@pytest.mark.parametrize("mscale", [1.0, 0.707])
def test_yarn_on_the_full_layers_matches_the_llama_cpp_graph_in_float64(heads, layer, mscale):
    cfg = yarn_config(motif3_config(*heads), mscale=mscale)
    sd = released_weights(cfg, layer)
    attn = from_motif3_attention(cfg, sd, layer).eval()
    m2 = (1 + 0.1 * mscale * math.log(4.0)) ** 2
    if layer == 0:  # YaRN's frequencies and m² on the softmax scale
        assert isinstance(attn.rotary, YarnRotaryEmbedding) and attn.scale == 18**-0.5 * m2
    else:  # the sliding-window layer: plain RoPE on swa_rope_theta, the plain scale
        assert type(attn.rotary) is RotaryEmbedding and attn.rotary.base == 500.0 and attn.scale == 18**-0.5
    x = torch.randn(2, 9, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    pos = torch.arange(3000, 3009)
    out = attn(x, position_ids=pos)
    for b in range(2):
        torch.testing.assert_close(out[b], reference(cfg, sd, layer, x[b], pos0=3000), **TOL)
    unscaled = {k: v for k, v in cfg.items() if k != "rope_scaling"}
    plain = from_motif3_attention(unscaled, sd, layer).eval()(x, position_ids=pos)
    if layer == 0:
        assert (out - plain).abs().max() > 1e-3  # YaRN changes the full layer
    else:
        assert torch.equal(out, plain)  # and leaves the sliding-window layer bit-identical


def test_the_math_and_sdpa_backends_agree_and_weights_come_back():
    cfg = motif3_config(10, 2, 2)
    attn = from_motif3_attention(cfg, released_weights(cfg, 0), 0).eval()
    x = torch.randn(1, 6, 48, dtype=torch.float64)
    out, w = attn(x, need_weights=True)
    torch.testing.assert_close(out, attn(x), rtol=0, atol=0)
    assert w.first.shape == w.second.shape == (1, 8, 6, 6)
    assert torch.equal(w.second[:, 0], w.second[:, 3]) and torch.allclose(w.first.sum(-1), torch.ones(1, 8, 6,
                                                                                                    dtype=torch.float64))
    for backend in ("math", "sdpa"):
        attn.backend = backend
        torch.testing.assert_close(attn(x), out, **TOL)


# ------------------------------------------------------------------------------------------- the latent cache

@pytest.mark.parametrize("heads", CONFIGS)
@pytest.mark.parametrize("cache", [KVCache, lambda: StaticKVCache(16)], ids=["dynamic", "static"])
def test_latent_cache_decoding_gives_the_full_forward(heads, cache):
    cfg = motif3_config(*heads)
    sd = released_weights(cfg, 0)
    attn = from_motif3_attention(cfg, sd, 0).eval()
    assert attn.uses_latent_cache
    x = torch.randn(1, 10, 48, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    full = attn(x)
    kv = cache()
    steps = [attn(x[:, :4], kv_cache=kv)] + [attn(x[:, t:t + 1], kv_cache=kv) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    assert kv.k.shape[1] == 1 and kv.k.shape[-1] == 16 and kv.v.shape[-1] == 4  # c_kv and K_rope, one "head"
    # llama.cpp's MLA path (wk_b absorbed, wv_b after), prefill then one token, is the same again
    past: dict = {}
    ref = [reference(cfg, sd, 0, x[0, :4], mla=True, past=past)]
    ref += [reference(cfg, sd, 0, x[0, t:t + 1], pos0=t, mla=True, past=past) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(ref), full[0], **TOL)


@pytest.mark.parametrize("heads", CONFIGS[:2])
def test_latent_cache_decoding_with_yarn_gives_the_full_forward(heads):
    cfg = yarn_config(motif3_config(*heads), mscale=0.707)
    sd = released_weights(cfg, 0)
    attn = from_motif3_attention(cfg, sd, 0).eval()
    x = torch.randn(1, 10, 48, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    full = attn(x)
    kv = KVCache()
    steps = [attn(x[:, :4], kv_cache=kv)] + [attn(x[:, t:t + 1], kv_cache=kv) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    assert kv.k.shape[-1] == 16 and kv.v.shape[-1] == 12  # c_kv and the YaRN-rotated K_rope
    past: dict = {}
    ref = [reference(cfg, sd, 0, x[0, :4], mla=True, past=past)]
    ref += [reference(cfg, sd, 0, x[0, t:t + 1], pos0=t, mla=True, past=past) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(ref), full[0], **TOL)
    torch.testing.assert_close(reference(cfg, sd, 0, x[0]), full[0], **TOL)


def test_the_cache_is_latent_on_full_layers_and_per_head_on_sliding_ones():
    cfg = motif3_config(10, 2, 2)
    full = from_motif3_attention(cfg, released_weights(cfg, 0), 0).eval()
    swa = from_motif3_attention(cfg, released_weights(cfg, 1), 1).eval()
    # per token: kv_lora_rank + d_rope = 16 + 4 against H_kv·(d_qk + d_v) = 2·(10 + 6)
    assert (full.cache_width(), swa.cache_width()) == (20, 32)
    off = GroupedLatentDiffAttention(48, 10, full.config.updated({"latent_cache": False})).double().eval()
    off.load_state_dict(full.state_dict())
    assert off.cache_width() == 32
    x = torch.randn(1, 7, 48, dtype=torch.float64)
    for layer in (swa, off):
        kv = KVCache()
        steps = [layer(x[:, :3], kv_cache=kv)] + [layer(x[:, t:t + 1], kv_cache=kv) for t in range(3, 7)]
        assert kv.k.shape == (1, 2, 7, 10) and kv.v.shape == (1, 2, 7, 6)
        torch.testing.assert_close(torch.cat(steps, 1), layer(x), **TOL)


# ------------------------------------------------------------------------------- through a model and inspect

def tiny_lm(**attention):
    spec = {"kind": "gdla", "causal": True, "rope": "half", "num_noise_heads": 1, "num_kv_heads": 1,
            "q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 8,
            **attention}
    torch.manual_seed(0)
    return diffattn.models.CausalLM(vocab_size=50, dim=32, depth=2, num_heads=5, max_seq_len=32, attention=spec)


@pytest.mark.parametrize("window", [None, 5])
def test_a_causal_lm_decodes_greedily_from_the_latent_cache(window):
    lm = tiny_lm(sliding_window=window).double().eval()
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(3))
    out = lm.generate(ids, 8)
    # greedy by hand with full forwards: the same tokens, the cached logits within 1e-10
    seq = ids
    for _ in range(8):
        seq = torch.cat([seq, lm(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)
    caches = lm.new_kv_caches()
    logits = [lm(seq[:, :6], kv_caches=caches)] + [lm(seq[:, t:t + 1], kv_caches=caches) for t in range(6, 13)]
    torch.testing.assert_close(torch.cat(logits, 1), lm(seq[:, :13]), **TOL)
    assert caches[0].k.shape[1:] == ((1, 13, 8) if window is None else (1, 13, 10))


def test_a_model_with_the_kind_saves_loads_and_is_diagnosed(tmp_path):
    lm = tiny_lm().eval()
    ids = torch.randint(0, 50, (1, 12))
    lm.save_pretrained(tmp_path / "lm")
    loaded = diffattn.from_pretrained(tmp_path / "lm").eval()
    assert loaded.attention_spec == lm.attention_spec and type(loaded.blocks[0].attn) is GroupedLatentDiffAttention
    torch.testing.assert_close(loaded(ids), lm(ids), rtol=0, atol=0)

    assert [(n, k) for n, _, k in logit_layers(lm)] == [("blocks.0.attn", "gdla"), ("blocks.1.attn", "gdla")]
    with capture_logits(lm) as cap:
        lm(ids)
    entry = cap.layers[0]
    assert entry["kind"] == "gdla" and [t.shape for t in entry["logits"]] == [(1, 4, 12, 12), (1, 1, 12, 12)]
    layer, x = lm.blocks[0].attn, lm.blocks[0].norm1(lm.tok_embed(ids))
    _, w = layer(x, need_weights=True)  # the noise head's map: softmax of its captured logits under the mask
    s = entry["logits"][1].masked_fill(~entry["mask"], float("-inf"))
    torch.testing.assert_close(torch.softmax(s, -1)[:, 0], w.second[:, 0].detach(), rtol=1e-5, atol=1e-6)

    from diffattn.eval.inspection import inspect_folder
    summary = inspect_folder(tmp_path / "lm", tmp_path / "inspect", ids=list(range(10)), needle_ids=[40, 41],
                             plots=False)
    assert len(summary["layers"]) == 2 and summary["layers"][0]["kind"] == "gdla"
