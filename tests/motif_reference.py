"""A float64 transcription of the public Motif model code, for tests/test_convert_motif.py.

Transcribed (the math, not the code) from vLLM, Apache-2.0 (https://github.com/vllm-project/vllm, LICENSE):
``vllm/model_executor/models/motif.py`` (MotifForCausalLM: decoder layer, MotifAttention with
``lambda_init_fn(depth) = 0.8 − 0.6·exp(−0.3·(depth − 1))``, ``subln`` = RMSNorm(2·head_dim, attn_rms_norm_eps),
MotifMLP = down(PolyNorm(gate) ⊙ up), neox-style RoPE), ``vllm/v1/attention/backends/grouped_diff_attn.py``
(GroupedDifferentialAttentionImpl: ``split_q_heads`` into groups [Q1 × r, Q2], ``split_heads`` of K and V into
even/odd heads, four causal attention calls, ``attn2`` repeated r times per group, λ = exp(Σ λ_q1 λ_k1) −
exp(Σ λ_q2 λ_k2) + λ_init, subln, × (1 − λ_init)) and ``vllm/model_executor/layers/layernorm.py`` (PolyNorm,
RMSNorm). It works on the released tensor names and config.json keys directly and uses no diffattn code.
"""

from __future__ import annotations

import math

import torch


def _rms(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _poly_norm(x, w, b, eps=1e-6):
    def n(t):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps)

    return w[0] * n(x ** 3) + w[1] * n(x ** 2) + w[2] * n(x) + b


def _rope_neox(x, pos, theta):
    """x (N, H, d): rotate-half RoPE (is_neox_style=True)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    f = pos.to(torch.float64)[:, None] * inv[None]  # (N, d/2)
    cos, sin = torch.cos(f)[:, None, :], torch.sin(f)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _causal_attention(q, k, v, scale):
    """q (N, Hq, d), k/v (N, Hkv, d): flash-attention semantics with GQA (query head j reads kv head
    j // (Hq / Hkv)), causal; returns (N, Hq, d)."""
    n, hq, _ = q.shape
    g = hq // k.shape[1]
    out = torch.empty(n, hq, v.shape[-1], dtype=torch.float64)
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))
    for j in range(hq):
        s = (q[:, j] @ k[:, j // g].T) * scale
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
        out[:, j] = p @ v[:, j // g]
    return out


def motif_logits(config: dict, sd: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """Logits (N, V) of one sequence ``ids`` (N,) under a released Motif config and state dict, in float64."""
    sd = {k: v.double() for k, v in sd.items()}
    hidden, h = config["hidden_size"], config["num_attention_heads"]
    hn = config.get("num_noise_heads", h // 2)
    hkv = config.get("num_key_value_heads", h)
    d = config.get("head_dim") or hidden // h
    theta = config.get("rope_theta", 10000.0)
    eps, attn_eps = config["rms_norm_eps"], config["attn_rms_norm_eps"]
    groups, group_size = hn, h // hn
    r = (h - hn) // hn  # q_head_group_ratio; local Q1 heads per group
    n = ids.shape[0]
    pos = torch.arange(n)

    def lin(x, name):
        y = x @ sd[name + ".weight"].T
        return y + sd[name + ".bias"] if name + ".bias" in sd else y

    x = sd["model.embed_tokens.weight"][ids]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        lambda_init = 0.8 - 0.6 * math.exp(-0.3 * (i - 1))
        res = x
        t = _rms(x, sd[p + "input_layernorm.weight"], eps)
        q = lin(t, p + "self_attn.q_proj").view(n, h, d)
        k = lin(t, p + "self_attn.k_proj").view(n, hkv, d)
        v = lin(t, p + "self_attn.v_proj").view(n, hkv, d)
        q, k = _rope_neox(q, pos, theta), _rope_neox(k, pos, theta)
        lam = torch.exp((sd[p + "self_attn.lambda_q1"] * sd[p + "self_attn.lambda_k1"]).sum(-1)) \
            - torch.exp((sd[p + "self_attn.lambda_q2"] * sd[p + "self_attn.lambda_k2"]).sum(-1)) + lambda_init
        qg = q.view(n, groups, group_size, d)
        q1, q2 = qg[:, :, :r].reshape(n, -1, d), qg[:, :, r:].reshape(n, -1, d)
        k1, k2, v1, v2 = k[:, 0::2], k[:, 1::2], v[:, 0::2], v[:, 1::2]
        scale = d ** -0.5
        attn1 = torch.cat([_causal_attention(q1, k1, v1, scale), _causal_attention(q1, k1, v2, scale)], dim=-1)
        attn2 = torch.cat([_causal_attention(q2, k2, v1, scale), _causal_attention(q2, k2, v2, scale)], dim=-1)
        attn2 = attn2.repeat_interleave(r, dim=1)  # einops "... H D -> ... (H r) D"
        a = _rms(attn1 - lam * attn2, sd[p + "self_attn.subln.weight"], attn_eps) * (1 - lambda_init)
        x = res + lin(a.reshape(n, -1), p + "self_attn.o_proj")
        t = _rms(x, sd[p + "post_attention_layernorm.weight"], eps)
        act = _poly_norm(lin(t, p + "mlp.gate_proj"), sd[p + "mlp.act_fn.weight"], sd[p + "mlp.act_fn.bias"])
        x = x + lin(act * lin(t, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = _rms(x, sd["model.norm.weight"], eps)
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return x @ head.T
