"""Property-based tests of retrofits (hypothesis): random tiny GPT-2 / Llama configurations (head counts, GQA ratios,
head widths), methods, dtypes, attention implementations and padding patterns.

- At step 0 a retrofitted model computes the pretrained function: its logits equal the base model's at every real
  (non-padding) position, and are finite everywhere.
- Off identity (random adapter weights, random step t), one retrofitted attention layer matches an independent
  float64 reference of its method's equation (DAA (2025) eq. 3, 4, 11 and App. D; Li et al. 2025 §3.2–3.3), fully
  masked query rows giving 0, within the dtype tolerance :data:`TOL`.

The default run is bounded (a few dozen examples); ``pytest -m fuzz --hypothesis-profile=long`` runs the long one.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import diffattn.adapters as A
from diffattn.adapters.methods import split_channels

from .reference import ref_softmax_rows, rotate

pytestmark = pytest.mark.fuzz

#: max |got − reference| allowed, by dtype (logits and attention outputs are O(1))
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}

_PROFILE = settings.get_current_profile_name()
EXAMPLES = min(settings.default.max_examples, 12) if _PROFILE == "default" else settings.default.max_examples
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                             HealthCheck.data_too_large])


@st.composite
def configs(draw):
    family = draw(st.sampled_from(["gpt2", "llama"]))
    method = draw(st.sampled_from(A.METHODS))
    d = draw(st.sampled_from([4, 8]))
    hkv = draw(st.integers(1, 2))
    h = hkv * (draw(st.integers(1, 3)) if family == "llama" else 1)  # GQA ratios 1–3 for Llama
    impl = draw(st.sampled_from(["eager", "sdpa"]))
    dtype = draw(st.sampled_from([torch.float64, torch.float32]))
    B, N = draw(st.integers(1, 3)), draw(st.integers(1, 7))
    pads = [(draw(st.integers(0, N - 1)), draw(st.sampled_from(["left", "right"]))) for _ in range(B)]
    seed = draw(st.integers(0, 2**16))
    return dict(family=family, method=method, d=d, h=h, hkv=hkv, impl=impl, dtype=dtype, B=B, N=N, pads=pads,
                seed=seed)


def build(c, impl=None):
    torch.manual_seed(c["seed"])
    impl = impl or c["impl"]
    D = c["h"] * c["d"]
    if c["family"] == "gpt2":
        cfg = T.GPT2Config(n_embd=D, n_layer=2, n_head=c["h"], vocab_size=64, n_positions=16, bos_token_id=0,
                           eos_token_id=0)
        m = T.GPT2LMHeadModel._from_config(cfg, attn_implementation=impl)
    else:
        cfg = T.LlamaConfig(hidden_size=D, intermediate_size=2 * D, num_hidden_layers=2, num_attention_heads=c["h"],
                            num_key_value_heads=c["hkv"], head_dim=c["d"], vocab_size=64, bos_token_id=0,
                            eos_token_id=0, pad_token_id=0)
        m = T.LlamaForCausalLM._from_config(cfg, attn_implementation=impl)
    return m.to(c["dtype"]).eval()


def attention_mask(c):
    am = torch.ones(c["B"], c["N"], dtype=torch.long)
    for b, (p, side) in enumerate(c["pads"]):
        if p:
            am[b, :p] = 0 if side == "left" else 1
            if side == "right":
                am[b, c["N"] - p:] = 0
    return am


@FUZZ
@given(configs())
def test_step0_is_the_pretrained_model(c):
    if c["method"] == "split_heads" and c["d"] % 4:
        return
    base = build(c)
    ref_model = build(c, "sdpa") if c["dtype"] == torch.float64 else base  # eager Llama softmaxes in float32
    ids = torch.randint(1, 60, (c["B"], c["N"]), generator=torch.Generator().manual_seed(c["seed"]))
    am = attention_mask(c)
    with torch.no_grad():
        ref = ref_model(input_ids=ids, attention_mask=am).logits
        got = A.retrofit(copy.deepcopy(base), c["method"])(input_ids=ids, attention_mask=am).logits
    assert bool(got.isfinite().all())
    keep = am.bool()
    err = (got[keep] - ref[keep]).abs().max().item()
    assert err <= TOL[c["dtype"]], (c, err)


# ----------------------------------------------------------------------------------- float64 reference


def _ref_layer(attn, c, x, allowed, cos, sin):
    """float64 reference of one retrofitted attention layer, written from the equations (no library code).

    x: (B, N, D); allowed: (B, N, N) bool (True = may attend, causal and padding); cos/sin: (B, N, d) or None."""
    ad = attn.diff_adapter
    f64 = torch.float64
    B, N, D = x.shape
    h, hkv, d = c["h"], c["hkv"], c["d"]
    g = h // hkv
    x = x.to(f64)
    if c["family"] == "gpt2":
        W, bias = attn.c_attn.weight.to(f64), attn.c_attn.bias.to(f64)  # Conv1D: x @ W + b

        def proj(inp, i):
            return (inp @ W[:, i * D:(i + 1) * D] + bias[i * D:(i + 1) * D]).view(B, N, -1, d).transpose(1, 2)

        Wo, bo = attn.c_proj.weight.to(f64), attn.c_proj.bias.to(f64)

        def out_proj(o):
            return o @ Wo + bo
    else:
        lin = [attn.q_proj, attn.k_proj, attn.v_proj]

        def proj(inp, i):
            return (inp @ lin[i].weight.to(f64).T).view(B, N, -1, d).transpose(1, 2)

        def out_proj(o):
            return o @ attn.o_proj.weight.to(f64).T

    def rope(t):
        return t if cos is None else rotate(t, cos[:, None].to(f64), sin[:, None].to(f64), "half")

    dead = ~allowed.any(-1, keepdim=True)  # (B, N, 1): query rows with no key (left padding under causality)

    def A_(q, k, s):  # per query head, key head j = i // g
        out = torch.empty(B, h, N, N, dtype=f64)
        for i in range(h):
            a = ref_softmax_rows(q[:, i] @ k[:, i // g].transpose(-1, -2) * s, allowed)
            # transformers' eager attention softmaxes equal finfo.min logits there: every key weighs 1/N
            out[:, i] = torch.where(dead, torch.full_like(a, 1.0 / N), a) if c["impl"] == "eager" else a
        return out

    def AV(a, v):
        return torch.stack([a[:, i] @ v[:, i // g] for i in range(h)], 1)  # (B, h, N, d)

    s = 1 / math.sqrt(d)
    Q0, K0, V = proj(x, 0), proj(x, 1), proj(x, 2)
    Q, K = rope(Q0), rope(K0)
    t, Tn = float(ad.step_buffer), ad.anneal_steps
    m = c["method"]
    if m in A.ANNEALED_METHODS:
        alpha = min(1.0, t / Tn)
        lam = (1 - alpha) * (t / Tn) * ad.lambda_init + alpha * float(ad.lam.lambda_learn.detach())  # DAA (2025) eq. 3
    else:
        lq1, lk1, lq2, lk2 = (getattr(ad.lam, n).detach().to(f64) for n in ("lambda_q1", "lambda_k1",
                                                                           "lambda_q2", "lambda_k2"))
        lam = float(torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + ad.lambda_init)
    A1 = A_(Q, K, s)
    if m == "daa":
        O = AV(A1 - lam * A_(rope(Q0 @ ad.W_daa.to(f64)), K, s), V)
    elif m == "dex":
        O = AV(A1, V) @ (torch.eye(d, dtype=f64) - lam * ad.W_dex.to(f64))
    elif m == "diffq":
        O = AV(A1 - lam * A_(rope(proj(x @ ad.W_dq.to(f64), 0)), K, s), V)
    elif m == "diffk":
        O = AV(A1 - lam * A_(Q, rope(proj(x @ ad.W_dk.to(f64), 1)), s), V)
    elif m == "diffv":
        O = AV(A1, V - lam * proj(x @ ad.W_dv.to(f64), 2))
    else:
        if m == "shared_qk":
            Od = AV(A1 - lam * A1, V)
        else:
            g1, g2 = split_channels(d)
            s2 = 1 / math.sqrt(d // 2)
            Od = AV(A_(Q[..., g1], K[..., g1], s2) - lam * A_(Q[..., g2], K[..., g2], s2), V)
        w = ad.diff_norm.weight.to(f64)
        Od = Od / torch.sqrt((Od**2).mean(-1, keepdim=True) + ad.diff_norm.eps) * w * (1 - ad.lambda_init)
        beta = min(1.0, t / Tn)
        O = (1 - beta) * AV(A1, V) + beta * Od
    return out_proj(O.transpose(1, 2).reshape(B, N, h * d))


@FUZZ
@given(configs(), st.integers(0, 30), st.floats(0.0, 0.5))
def test_layer_matches_float64_reference(c, t, noise):
    if c["method"] == "split_heads" and c["d"] % 4:
        return
    model = A.retrofit(build(c), c["method"], anneal_steps=20)
    g = torch.Generator().manual_seed(c["seed"] + 1)
    for _, a in A.adapters(model):
        for p in a.parameters():
            p.data.add_(noise * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    A.step(model, t)
    am = attention_mask(c)
    B, N = c["B"], c["N"]
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    allowed = causal[None] & am.bool()[:, None, :]  # (B, N, N)
    x = torch.randn(B, N, c["h"] * c["d"], generator=g, dtype=torch.float64).to(c["dtype"])
    if c["impl"] == "eager":
        mask = torch.zeros(B, 1, N, N, dtype=c["dtype"]).masked_fill(~allowed[:, None],
                                                                      torch.finfo(c["dtype"]).min)
    else:
        mask = allowed[:, None]
    if c["family"] == "gpt2":
        attn = model.transformer.h[0].attn
        cos = sin = None
        with torch.no_grad():
            got, _ = attn(x, attention_mask=mask)
    else:
        attn = model.model.layers[0].self_attn
        pos = torch.arange(N)[None].expand(B, N)
        with torch.no_grad():
            cos, sin = model.model.rotary_emb(x, pos)
            got, _ = attn(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)
    ref = _ref_layer(attn, c, x, allowed, cos, sin)
    assert bool(got.isfinite().all())
    err = (got.double() - ref).abs().max().item()
    assert err <= TOL[c["dtype"]] * max(1.0, ref.abs().max().item()), (c, t, noise, err)
