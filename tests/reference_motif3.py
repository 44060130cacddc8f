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
- RoPE: LLAMA_ROPE_TYPE_NEOX (pairs offset by n_rot / 2) on the rope part, base ``rope_theta``.
- YaRN (``hp["yarn"]``: factor, n_ctx_orig, beta_fast, beta_slow, mscale), full-attention layers only (the SWA
  layers: freq_scale 1, ext_factor 0, attn_factor 1, their own base): ggml_rope_ext with freq_scale = 1/factor,
  ext_factor = 1 (llama.cpp's context default for YaRN) and attn_factor = 1/(1 + 0.1 ln(1/freq_scale)); ggml's
  ``rope_yarn`` per pair i0 = 2i: theta_interp = freq_scale · theta_extrap, ramp = rope_yarn_ramp(corr_dims, i0) ·
  ext_factor, theta = theta_interp (1 − ramp) + theta_extrap · ramp, mscale = attn_factor · (1 + 0.1 ln(1/freq_scale)),
  cos/sin × mscale; corr_dims from ``ggml_rope_yarn_corr_dims`` (floor / ceil of n_dims ln(n_ctx_orig / (2π β)) /
  (2 ln base), clamped to [0, n_dims − 1]); rope_yarn_ramp(lo, hi, i0) = 1 − min(1, max(0, (i0/2 − lo) /
  max(0.001, hi − lo))).
- kq_scale = 1/√(nope + rope) on SWA layers and without YaRN; with YaRN on the full layers kq_scale_full =
  mscale_val² / √(nope + rope), mscale_val = 1 + 0.1 · motif_mscale · ln(1/freq_scale).
- SWA (LLAMA_SWA_TYPE_STANDARD): key p0 is masked for query p1 when p1 − p0 >= n_swa, n_swa = HF sliding_window + 1;
  causal: masked when p0 > p1.
- λ = sigmoid(lambda_proj · x) (n_signal per token); diff = attn1 − attn2 · λ; gate = sigmoid(wq_b_gate · q_lat)
  multiplies diff; out = wo · diff.
- MLA (latent cache, full layers): wk_b = wkv_b's k rows per KV head transposed, wv_b its v rows;
  Q = [wk_b-absorbed q_nope | q_pe] against K = [c_kv | k_pe], V = c_kv, then wv_b per head (``v_mla``).

The dense MLP (``build_polynorm_mlp`` → ``build_polynorm_act`` with clamp_bias = clamp_result = false; tensors under
``model.layers.{i}.mlp.``: ``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn.weight`` (3), ``act_fn.bias`` (1)):
- w = sigmoid(act_fn.weight) when ``polynorm.sigmoid_weight`` (default true); the bias is clamped to ±bias_clamp
  only when clamp_bias (the routed experts) and bias_clamp > 0.
- gate and up clamped to ±hidden_clamp when hidden_clamp > 0 (before x², x³); x2 = g·g, x3 = x2·g.
- poly = rms_norm(x3)·w0 + rms_norm(x2)·w1 + rms_norm(g)·w2 (summed in that order) + b; ggml_rms_norm(t) =
  t / √(mean(t²) + eps), eps = ``polynorm.epsilon``.
- act = poly·up, clamped to ±hidden_clamp only when clamp_result (the routed experts), times output_scale when it
  is not 1; out = down · act.
"""

from __future__ import annotations

import math

import torch

__all__ = ["motif3_attention_reference", "motif3_mlp_reference"]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple:
    """ggml_rope_yarn_corr_dims."""
    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    start, end = math.floor(corr_dim(beta_fast)), math.ceil(corr_dim(beta_slow))
    return max(0, start), min(n_dims - 1, end)


def _rope_neox(x: torch.Tensor, pos: torch.Tensor, base: float, yarn: dict | None = None) -> torch.Tensor:
    """ggml_rope_ext, mode NEOX: channel i pairs with i + n/2, theta_extrap = p · base^(−2i/n); ``yarn`` (factor,
    n_ctx_orig, beta_fast, beta_slow): ggml's rope_yarn with Motif-3's ext_factor and attn_factor. x (N, n)."""
    n = x.shape[-1]
    out = torch.empty_like(x)
    freq_scale, ext_factor, attn_factor, lo, hi = 1.0, 0.0, 1.0, 0, 0
    if yarn is not None:
        freq_scale, ext_factor = 1.0 / yarn["factor"], 1.0
        attn_factor = 1.0 / (1.0 + 0.1 * math.log(1.0 / freq_scale))
        lo, hi = _yarn_corr_dims(n, yarn["n_ctx_orig"], base, yarn["beta_fast"], yarn["beta_slow"])
    for t in range(x.shape[0]):
        for i in range(n // 2):
            i0 = 2 * i
            theta_extrap = float(pos[t]) * base ** (-float(i0) / n)
            theta_interp = freq_scale * theta_extrap
            theta, mscale = theta_interp, attn_factor
            if ext_factor != 0.0:
                ramp_mix = (1 - min(1.0, max(0.0, (i0 // 2 - lo) / max(0.001, hi - lo)))) * ext_factor
                theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
                mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
            c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
            x0, x1 = x[t, i], x[t, i + n // 2]
            out[t, i] = x0 * c - x1 * s
            out[t, i + n // 2] = x0 * s + x1 * c
    return out


def motif3_attention_reference(w: dict[str, torch.Tensor], x: torch.Tensor, hp: dict, *, pos0: int = 0,
                               n_swa: int | None = None, mla: bool = False, past: dict | None = None) -> torch.Tensor:
    """One sequence x (N, n_embd) float64 through the GDLA attention of one layer with weights ``w`` (short names:
    ``wq_a`` … ``wo``), hyper-parameters ``hp`` (n_head, n_head_kv, n_noise, kv_lora_rank, nope, rope, v,
    rope_theta, eps; optional ``yarn``: factor, n_ctx_orig, beta_fast, beta_slow, mscale, applied on a full layer
    only) → (N, n_embd). Positions start at ``pos0``; ``n_swa``: the SWA window (None: full, the layer YaRN scales);
    ``mla``: the latent path. ``past``, a dict this function fills, holds the keys and values (or latents) of the
    earlier calls (a KV cache, the same for both paths' inputs)."""
    H, Hkv, Hn = hp["n_head"], hp["n_head_kv"], hp["n_noise"]
    nope, rope, dv, r_kv = hp["nope"], hp["rope"], hp["v"], hp["kv_lora_rank"]
    ratio = (H - Hn) // Hn
    gs, Hs = ratio + 1, H - Hn
    N = x.shape[0]
    pos = torch.arange(pos0, pos0 + N)
    yarn = hp.get("yarn") if n_swa is None else None  # build_gdla_attn: is_swa → no YaRN, kq_scale_swa
    scale = 1.0 / math.sqrt(nope + rope)
    if yarn is not None:
        mscale_val = 1.0 + 0.1 * yarn["mscale"] * math.log(yarn["factor"])  # log(1 / freq_scale)
        scale = mscale_val * mscale_val / math.sqrt(nope + rope)

    q_lat = _rms(x @ w["wq_a"].T, w["q_norm"], hp["eps"])
    q = (q_lat @ w["wq_b"].T).view(N, H, nope + rope)
    q_nope, q_pe = q[..., :nope], q[..., nope:]
    kv_raw = x @ w["wkv_a"].T
    kv_cmpr, k_pe = kv_raw[:, :r_kv], kv_raw[:, r_kv:]
    q_pe = torch.stack([_rope_neox(q_pe[:, h], pos, hp["rope_theta"], yarn) for h in range(H)], dim=1)
    k_pe = _rope_neox(k_pe, pos, hp["rope_theta"], yarn)
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


def motif3_mlp_reference(w: dict[str, torch.Tensor], x: torch.Tensor, hp: dict, *, clamp_bias: bool = False,
                         clamp_result: bool = False) -> torch.Tensor:
    """x (N, n_embd) float64 through the PolyNorm MLP with weights ``w`` (``gate_proj``, ``up_proj``, ``down_proj``,
    ``poly_w``, ``poly_b``) and hyper-parameters ``hp`` (eps, sigmoid_w, out_scale, bias_clamp, hidden_clamp; 0 for
    a clamp that is off, as the hparams hold it) → (N, n_embd). ``clamp_bias`` / ``clamp_result``: the routed
    experts' flags (both false for a dense layer and the shared expert). Token by token, as ggml's row ops go."""
    eps, h_clamp, b_clamp = hp["eps"], hp["hidden_clamp"], hp["bias_clamp"]
    pw, pb = w["poly_w"], w["poly_b"]
    if hp["sigmoid_w"]:
        pw = 1.0 / (1.0 + torch.exp(-pw))
    if clamp_bias and b_clamp > 0.0:
        pb = pb.clamp(-b_clamp, b_clamp)
    w0, w1, w2, b = pw[0], pw[1], pw[2], pb[0]

    def rms(t: torch.Tensor) -> torch.Tensor:
        return t / math.sqrt(float((t * t).sum()) / t.shape[0] + eps)

    rows = []
    for t in range(x.shape[0]):
        gate = w["gate_proj"] @ x[t]
        up = w["up_proj"] @ x[t]
        if h_clamp > 0.0:
            gate = gate.clamp(-h_clamp, h_clamp)
            up = up.clamp(-h_clamp, h_clamp)
        x2 = gate * gate
        x3 = x2 * gate
        poly = rms(x3) * w0 + rms(x2) * w1 + rms(gate) * w2
        poly = poly + b
        act = poly * up
        if clamp_result and h_clamp > 0.0:
            act = act.clamp(-h_clamp, h_clamp)
        if hp["out_scale"] != 1.0:
            act = act * hp["out_scale"]
        rows.append(w["down_proj"] @ act)
    return torch.stack(rows)
