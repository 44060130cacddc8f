"""A float64 transcription of Motif-3's attention graph as llama.cpp computes it (``src/models/motif3.cpp``,
``build_gdla_attn``; ``conversion/motif3.py`` for the tensor names and the ``wkv_b`` split; MIT), written
independently of diffattn: explicit per-head loops, ggml's operand order and masks, on the released checkpoint's
tensor names (``model.layers.{i}.self_attn.`` + ``wq_a``, ``q_norm``, ``wq_b``, ``wq_b_gate``, ``wkv_a``,
``kv_norm``, ``wkv_b``, ``lambda_proj``, ``wo``; weights (out, in) as torch stores them).

Conventions read from the graph:
- ``wq_b``'s output holds n_head heads of width nope + rope, each [nope | rope]; the heads come in n_noise groups of
  ratio + 1 ([signal × ratio, noise]), the output's signal heads in order g·ratio + j.
- ``wkv_a``'s output is [c_kv (kv_lora_rank) | k_pe (rope)]; ``wkv_b`` gives per KV head [k_nope | v].
- Q and K are assembled [rope | nope], k_pe repeated over the KV heads; query head h reads KV head
  h / (n_head / n_head_kv) (ggml's broadcast in ``build_attn``).
- RoPE: LLAMA_ROPE_TYPE_NEOX (pairs offset by n_rot / 2) on the rope part, base ``rope_theta``; no YaRN here.
- kq_scale = 1/√(nope + rope) (no YaRN: mscale = 1).
- SWA (LLAMA_SWA_TYPE_STANDARD): key p0 is masked for query p1 when p1 − p0 >= n_swa, n_swa = HF sliding_window + 1;
  causal: masked when p0 > p1.
- λ = sigmoid(lambda_proj · x) (n_signal per token); diff = attn1 − attn2 · λ; gate = sigmoid(wq_b_gate · q_lat)
  multiplies diff; out = wo · diff.
- MLA (latent cache, full layers): wk_b = wkv_b's k rows per KV head transposed, wv_b its v rows;
  Q = [wk_b-absorbed q_nope | q_pe] against K = [c_kv | k_pe], V = c_kv, then wv_b per head (``v_mla``).
"""

from __future__ import annotations

import math

import torch

__all__ = ["motif3_attention_reference"]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope_neox(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """ggml_rope_ext, mode NEOX, no scaling: channel i pairs with i + n/2, θ_i = p · base^(−2i/n). x (N, n)."""
    n = x.shape[-1]
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        for i in range(n // 2):
            theta = float(pos[t]) * base ** (-2.0 * i / n)
            c, s = math.cos(theta), math.sin(theta)
            x0, x1 = x[t, i], x[t, i + n // 2]
            out[t, i] = x0 * c - x1 * s
            out[t, i + n // 2] = x0 * s + x1 * c
    return out


def motif3_attention_reference(w: dict[str, torch.Tensor], x: torch.Tensor, hp: dict, *, pos0: int = 0,
                               n_swa: int | None = None, mla: bool = False, past: dict | None = None) -> torch.Tensor:
    """One sequence x (N, n_embd) float64 through the GDLA attention of one layer with weights ``w`` (short names:
    ``wq_a`` … ``wo``), hyper-parameters ``hp`` (n_head, n_head_kv, n_noise, kv_lora_rank, nope, rope, v,
    rope_theta, eps) → (N, n_embd). Positions start at ``pos0``; ``n_swa``: the SWA window (None: full);
    ``mla``: the latent path. ``past``, a dict this function fills, holds the keys and values (or latents) of the
    earlier calls (a KV cache, the same for both paths' inputs)."""
    H, Hkv, Hn = hp["n_head"], hp["n_head_kv"], hp["n_noise"]
    nope, rope, dv, r_kv = hp["nope"], hp["rope"], hp["v"], hp["kv_lora_rank"]
    ratio = (H - Hn) // Hn
    gs, Hs = ratio + 1, H - Hn
    N = x.shape[0]
    pos = torch.arange(pos0, pos0 + N)
    scale = 1.0 / math.sqrt(nope + rope)

    q_lat = _rms(x @ w["wq_a"].T, w["q_norm"], hp["eps"])
    q = (q_lat @ w["wq_b"].T).view(N, H, nope + rope)
    q_nope, q_pe = q[..., :nope], q[..., nope:]
    kv_raw = x @ w["wkv_a"].T
    kv_cmpr, k_pe = kv_raw[:, :r_kv], kv_raw[:, r_kv:]
    q_pe = torch.stack([_rope_neox(q_pe[:, h], pos, hp["rope_theta"]) for h in range(H)], dim=1)
    k_pe = _rope_neox(k_pe, pos, hp["rope_theta"])
    kv_cmpr = _rms(kv_cmpr, w["kv_norm"], hp["eps"])

    kv_b = w["wkv_b"].view(Hkv, nope + dv, r_kv)
    if mla:
        wk_b = kv_b[:, :nope].transpose(1, 2)  # {nope, kv_lora_rank, n_head_kv} as conversion/motif3.py writes it
        wv_b = kv_b[:, nope:]  # (Hkv, v, kv_lora_rank)
        Q = torch.stack([torch.cat([q_nope[:, h] @ wk_b[h // (H // Hkv)].T, q_pe[:, h]], -1) for h in range(H)], 1)
        K_new = torch.cat([kv_cmpr, k_pe], -1)[:, None]  # (N, 1, kv_lora_rank + rope)
        V_new = kv_cmpr[:, None]
    else:
        kv = (kv_cmpr @ w["wkv_b"].T).view(N, Hkv, nope + dv)
        k_nope, V_new = kv[..., :nope], kv[..., nope:]
        Q = torch.cat([q_pe, q_nope], -1)  # [rope | nope]
        K_new = torch.cat([k_pe[:, None].expand(N, Hkv, rope), k_nope], -1)
    if past is not None:
        if "K" in past:
            K_new, V_new = torch.cat([past["K"], K_new]), torch.cat([past["V"], V_new])
        past["K"], past["V"] = K_new, V_new
    K, V = K_new, V_new
    Nk = K.shape[0]
    kpos = torch.arange(pos0 + N - Nk, pos0 + N)

    heads = []
    for h in range(H):
        m = h // (H // K.shape[1]) if K.shape[1] > 1 else 0
        s = (Q[:, h] @ K[:, m].T) * scale  # (N, Nk)
        for t in range(N):
            for j in range(Nk):
                p1, p0 = int(pos[t]), int(kpos[j])
                if p0 > p1 or (n_swa is not None and p1 - p0 >= n_swa):
                    s[t, j] = -math.inf
        a = torch.softmax(s, dim=-1) @ V[:, m]
        if mla:
            a = a @ wv_b[h // (H // Hkv)].T  # v_mla
        heads.append(a)
    attn = torch.stack(heads, 1)  # (N, H, v)

    lam = torch.sigmoid(x @ w["lambda_proj"].T)  # (N, n_signal)
    gate = torch.sigmoid(q_lat @ w["wq_b_gate"].T) if "wq_b_gate" in w else None
    a4 = attn.view(N, Hn, gs, dv)
    attn1, attn2 = a4[:, :, :ratio], a4[:, :, ratio:]
    diff = attn1 - attn2 * lam.view(N, Hn, ratio, 1)
    if gate is not None:
        diff = diff * gate.view(N, Hn, ratio, dv)
    return diff.reshape(N, Hs * dv) @ w["wo"].T
