"""Independent float64 references of the equations, written without library code."""

from __future__ import annotations

import math

import torch

F64 = torch.float64

# The one statement of how close each dtype must come to the float64 references: max |out − ref| ≤ atol + rtol·|ref|
# element-wise, for inputs of unit scale. float16 is not listed: it is only checked against the other backends.
TOLERANCES = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.bfloat16: dict(atol=4e-2, rtol=4e-2),
}


def ref_softmax_rows(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Row softmax over allowed keys only; a row with no allowed key is all zeros."""
    if scores.numel() == 0:
        return torch.zeros_like(scores)
    s = scores.masked_fill(~allowed, -math.inf)
    mx = s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    e = torch.exp(s - mx) * allowed
    den = e.sum(-1, keepdim=True)
    return torch.where(den > 0, e / den.clamp_min(1e-300), torch.zeros_like(e))


def reference(q1, k1, q2, k2, v, lam, w1=1.0, allowed=None, bias=None, causal=False, scale=None, softcap=None):
    """float64 (w1 A1 − λ A2) V written head by head, with GQA by index (head i reads kv head i // g).

    A_b = softmax(cap(Q_b K_bᵀ s) + bias) over the allowed keys; cap(x) = c·tanh(x / c) when ``softcap`` = c.
    """
    q1, k1, q2, k2, v = (t.to(F64) for t in (q1, k1, q2, k2, v))
    B, H, nq, d = q1.shape
    hkv, nk = k1.shape[1], k1.shape[2]
    g = H // hkv
    scale = 1 / math.sqrt(d) if scale is None else scale
    ok = torch.ones(B, H, nq, nk, dtype=torch.bool)
    if allowed is not None:
        ok = ok & allowed.expand(B, H, nq, nk)
    if causal:
        for i in range(nq):
            for j in range(nk):
                if j > i + (nk - nq):
                    ok[:, :, i, j] = False
    lam = torch.as_tensor(lam, dtype=F64).expand(B, H, nq, 1)
    w1 = torch.as_tensor(w1, dtype=F64).expand(B, H, nq, 1)
    out = torch.zeros(B, H, nq, v.shape[-1], dtype=F64)
    for h in range(H):
        j = h // g
        s1 = q1[:, h] @ k1[:, j].transpose(-1, -2) * scale
        s2 = q2[:, h] @ k2[:, j].transpose(-1, -2) * scale
        if softcap is not None:
            s1, s2 = softcap * torch.tanh(s1 / softcap), softcap * torch.tanh(s2 / softcap)
        if bias is not None:
            bb = bias.to(F64).expand(B, H, nq, nk)[:, h]
            s1, s2 = s1 + bb, s2 + bb
        a1 = ref_softmax_rows(s1, ok[:, h])
        a2 = ref_softmax_rows(s2, ok[:, h])
        out[:, h] = (w1[:, h] * a1 - lam[:, h] * a2) @ v[:, j]
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) ⊙ w over the last dim."""
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.to(F64)


def rope_tables(n: int, d: int, base: float = 10000.0, start: int = 0, style: str = "half"):
    """cos/sin (N, d) in float64: pair frequency θ_i = base^(−2i/d)."""
    pos = torch.arange(start, start + n, dtype=F64)[:, None]
    theta = base ** (-torch.arange(0, d, 2, dtype=F64) / d)[None, :]
    ang = pos * theta  # (N, d/2)
    if style == "half":
        ang = torch.cat([ang, ang], -1)
    else:
        ang = ang.repeat_interleave(2, -1)
    return ang.cos(), ang.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str = "half") -> torch.Tensor:
    """Rotary embedding of x (..., N, d): pairs (i, i + d/2) for "half", (2i, 2i + 1) for "interleaved"."""
    d = x.shape[-1]
    if style == "half":
        a, b = x[..., : d // 2], x[..., d // 2:]
        rot = torch.cat([-b, a], -1)
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        rot = torch.stack([-b, a], -1).flatten(-2)
    return x * cos + rot * sin


def ref_diff_v2(x, wq, wk, wv, wl, wo, num_heads, num_kv_heads, bq=None, bk=None, bv=None, bo=None, allowed=None,
                causal=False):
    """Diff Transformer V2 from its equation, float64, from raw weights (no library code):

    Q = x W_qᵀ: 2h heads of width d; K = x W_kᵀ, V = x W_vᵀ: h_kv heads of width d; query head j reads kv head
    j // (2h / h_kv); O_i = A_{2i} V − σ(x W_λᵀ)_i ⊙ A_{2i+1} V per token; out = concat_i O_i W_oᵀ.
    ``allowed``: bool (B, N, N) or None.
    """
    def lin(t, w, b):
        y = t @ w.to(F64).T
        return y if b is None else y + b.to(F64)

    x = x.to(F64)
    B, N, _ = x.shape
    h, hkv = num_heads, num_kv_heads
    d = wq.shape[0] // (2 * h)
    q = lin(x, wq, bq).view(B, N, 2 * h, d)
    k = lin(x, wk, bk).view(B, N, hkv, d)
    v = lin(x, wv, bv).view(B, N, hkv, d)
    lam = torch.sigmoid(x @ wl.to(F64).T)  # (B, N, h)
    ok = torch.ones(B, N, N, dtype=torch.bool) if allowed is None else allowed.clone()
    if causal:
        ok &= torch.ones(N, N, dtype=torch.bool).tril()
    per_group = 2 * h // hkv
    heads = []
    for i in range(h):
        j1, j2 = (2 * i) // per_group, (2 * i + 1) // per_group
        a1 = ref_softmax_rows(q[:, :, 2 * i] @ k[:, :, j1].transpose(1, 2) / math.sqrt(d), ok)
        a2 = ref_softmax_rows(q[:, :, 2 * i + 1] @ k[:, :, j2].transpose(1, 2) / math.sqrt(d), ok)
        heads.append(a1 @ v[:, :, j1] - lam[:, :, i:i + 1] * (a2 @ v[:, :, j2]))
    return lin(torch.cat(heads, -1), wo, bo)


def ref_gdla_heads(x: torch.Tensor, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, *, num_heads: int,
                   num_kv_heads: int, nope: int, rope: int, v_dim: int, eps: float, base: float,
                   style: str = "half") -> dict[str, torch.Tensor]:
    """Grouped differential latent attention's (Motif-3) queries, keys and values per query head, float64 from raw
    weights (no library code), the low-rank projections of multi-head latent attention (DeepSeek-AI 2024, arXiv
    2405.04434, §2.1):

    c_q = RMSNorm(x W_qa), [Q_nope | Q_rope]_h = (c_q W_qb)_h; [c_kv | K_rope] = x W_kva, c_kv ← RMSNorm(c_kv),
    [K_nope | V]_m = (c_kv W_kvb)_m; RoPE on Q_rope and on K_rope (one for every key head); query head h reads
    key/value head m = h // (H / H_kv). Returns {"q", "k": (B, H, N, nope + rope) [nope | rope], "v": (B, H, N,
    v_dim), "c_q": (B, N, q_lora_rank)}."""
    x = x.to(F64)
    B, N, _ = x.shape
    H, hkv = num_heads, num_kv_heads
    c_q = rms_norm(x @ wq_a.to(F64).T, q_norm, eps)
    q = (c_q @ wq_b.to(F64).T).view(B, N, H, nope + rope).transpose(1, 2)  # (B, H, N, nope + rope)
    kv_a = x @ wkv_a.to(F64).T
    c_kv, k_rope = rms_norm(kv_a[..., :-rope], kv_norm, eps), kv_a[..., -rope:]
    kv = (c_kv @ wkv_b.to(F64).T).view(B, N, hkv, nope + v_dim).transpose(1, 2)  # (B, H_kv, N, nope + v)
    cos, sin = rope_tables(N, rope, base, style=style)
    q = torch.cat([q[..., :nope], rotate(q[..., nope:], cos, sin, style)], -1)
    k_rope = rotate(k_rope, cos, sin, style)[:, None].expand(B, hkv, N, rope)
    k = torch.cat([kv[..., :nope], k_rope], -1)
    m = [h // (H // hkv) for h in range(H)]
    return {"q": q, "k": k[:, m], "v": kv[:, m, :, nope:], "c_q": c_q}


def kind_head_pairs(kind: str, q: torch.Tensor, k: torch.Tensor, num_noise_heads: int | None = None) -> list:
    """The (queries, keys) of each map of attention ``kind``, the head layout written out: standard one map per query
    head; diff / gated Q/K heads (2i, 2i+1); V2 query heads (2i, 2i+1) against one K head; grouped query heads in
    groups [signal × r, noise], signal keys K heads 2m, noise keys 2m + 1, one A2 per noise head (Motif Technologies
    2025, arXiv 2510.06949); gdla (Motif-3) the same groups of query heads, each with the keys of its own head (k
    holds one key head per query head, :func:`ref_gdla_heads`). q: (B, q_heads, N, d), k: (B, kv_heads, N, d); GQA
    repeats are the caller's."""
    if kind == "standard":
        return [(q, k)]
    if kind == "gdla":
        gq, gk = (t.unflatten(1, (num_noise_heads, -1)) for t in (q, k))  # (B, H_n, r + 1, N, d)
        return [(gq[:, :, :-1].flatten(1, 2), gk[:, :, :-1].flatten(1, 2)), (gq[:, :, -1], gk[:, :, -1])]
    if kind == "diff_v2":
        return [(q[:, 0::2], k), (q[:, 1::2], k)]
    if kind == "grouped":
        g = q.unflatten(1, (num_noise_heads, -1))  # (B, H_n, r + 1, N, d)
        return [(g[:, :, :-1].flatten(1, 2), k[:, 0::2]), (g[:, :, -1], k[:, 1::2])]
    return [(q[:, 0::2], k[:, 0::2]), (q[:, 1::2], k[:, 1::2])]


def gdla_layer_heads(layer, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`ref_gdla_heads` with the weights and sizes of a GDLA layer (``GroupedLatentDiffAttention``)."""
    w = {name: getattr(layer, name).weight.detach() for name in ("q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj",
                                                                "kv_a_norm", "kv_b_proj")}
    return ref_gdla_heads(x, w["q_a_proj"], w["q_a_norm"], w["q_b_proj"], w["kv_a_proj"], w["kv_a_norm"],
                          w["kv_b_proj"], num_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads,
                          nope=layer.qk_nope_head_dim, rope=layer.qk_rope_head_dim, v_dim=layer.v_head_dim,
                          eps=layer.q_a_norm.eps, base=layer.rotary.base, style=layer.rotary.style)
