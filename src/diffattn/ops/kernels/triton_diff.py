"""Fused one-pass Triton kernels for differential attention, forward and backward.

    O = (w1 ⊙ A1 − λ ⊙ A2) V,   A1 = softmax(Q1 K1ᵀ · s + M),   A2 = softmax(Q2 K2ᵀ · s + M)

Differential attention from Ye et al. 2024, "Differential Transformer" (eq. 1, w1 = 1, one λ per layer);
the M-DGSA (2025) gate passes w1 = g and λ = 1 − g per query token and head. docs/design.md has the layer and
the cost argument this kernel is built on: (w1 A1 − λ A2) V = w1 (A1 V) − λ (A2 V), so each
branch is an ordinary online-softmax attention, and the two can share one pass over the keys.

Forward (one program per BLOCK_M query rows of one head; FlashAttention-2 loop order):
    load Q1, Q2 tiles once; for each BLOCK_N key tile load K1, K2, V once and update TWO online-softmax states
    (m1, l1, acc1) and (m2, l2, acc2), acc of width dv; write O = w1 ⊙ acc1 / l1 − λ ⊙ acc2 / l2 once, the two
    log-sum-exps (log2 units) and, when a gradient is needed, the branch outputs O1 = A1 V and O2 = A2 V.

Backward (FlashAttention-2 style, recomputing P from the saved log-sum-exps):
    preprocess   r_b = rowsum(dO ⊙ O_b). With dO_1 = w1 ⊙ dO and dO_2 = −λ ⊙ dO the usual FA-2 term is
                 D_b = rowsum(dO_b ⊙ O_b) = w_b ⊙ r_b (w_1 = w1, w_2 = −λ); r_b is also the weight gradient:
                 ∂L/∂w1 = r_1 and ∂L/∂λ = −r_2 (summed down to the weights' broadcast shapes).
    dK/dV kernel one program per BLOCK_N keys of one kv head, looping over the query heads of its GQA group
                 (no atomics). Because both branches read the same V and the same dO:
                     dV   = (w1 ⊙ P1 − λ ⊙ P2)ᵀ dO                     (one matmul, not two)
                     dP   = dO Vᵀ                                        (shared by both branches)
                     dS_b = w_b ⊙ P_b ⊙ (dP − r_b),   dK_b = s · dS_bᵀ Q_b
    dQ kernel    one program per BLOCK_M query rows: dQ_b = s · dS_b K_b.

What is saved for backward: Q1, K1, Q2, K2, V, the two log-sum-exps (fp32, B·H·Nq each) and O1, O2 (dtype of
v), but not O. The two branch outputs are needed because the preprocess needs r_1 and r_2 separately, and
the final output only gives one equation, rowsum(dO ⊙ O) = w1 r_1 − λ r_2, for two unknowns. Recomputing O1
instead would cost a second pass over K and V for one branch (about half of the forward FLOPs); storing it
costs one extra output-sized tensor, the same the ``sdpa`` backend keeps (each of its two attention calls
saves its output). Without autograd (inference) only O is written.

Masks: a causal mask aligned to the end (query i sees keys j ≤ i + Nk − Nq) and key-padding masks (bool or
additive float, one row of Nk values per batch element) are applied inside the kernels as a per-key bias. A
query row whose keys are all masked gets l = 0: its output is exactly 0 and its gradients are exactly 0.

Precision: scores, softmax statistics and accumulators are fp32; P and dS are cast to the input dtype before
the matmuls with V, Q and K (as in FlashAttention-2). fp32 inputs use 3×TF32 matmuls (about fp32 accuracy).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..masks import blocked

__all__ = ["fused_layer_attention", "fused_layer_reason", "triton_diff_attention", "triton_unsupported_reason"]

Weight = float | torch.Tensor

LOG2E = 1.4426950408889634  # softmax runs in base 2: exp(x) = exp2(x · log2 e)
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, read at definition)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# ----------------------------------------------------------------------------------------------- kernels


@triton.jit
def _online_softmax_step(s, m, l, acc, v, PREC: tl.constexpr):
    """One FlashAttention-2 update of (m, l, acc) with a (BLOCK_M, BLOCK_N) tile of log2-scaled scores ``s``.

    Rows that have seen only masked keys keep m = −inf, l = 0, acc = 0 (m_safe avoids −inf − (−inf) = NaN).
    """
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])  # (BLOCK_M, BLOCK_N)
    alpha = tl.math.exp2(m - m_safe)  # rescales what was accumulated under the old max
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)  # (BLOCK_M, DV)
    return m_new, l, acc


@triton.jit
def _row_weights(W1, LAM, LQ1, LK1, LQ2, LK2, lam_init, w_off, l_off, row_ok,
                 HEAD_D: tl.constexpr, LAM_MODE: tl.constexpr):
    """(w1, λ) of BLOCK_M rows in fp32 (0 on rows that are not ``row_ok``), by ``LAM_MODE``:

    0  read from the row tensors W1 and LAM (any λ form, computed before the kernel);
    1  λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, w1 = 1 (Ye et al. 2024, eq. 2; the four vectors of width d);
    2  the M-DGSA gate (Lygizou & Kalamaras 2025, eq. 3): W1 holds the logits z, w1 = σ(z), λ = 1 − σ(z);
    3  Differential Transformer V2 (Ye et al. 2026): W1 holds the logits z, w1 = 1, λ = σ(z).
    """
    if LAM_MODE == 0:
        w1 = tl.load(W1 + w_off, mask=row_ok, other=0.0).to(tl.float32)
        lam = tl.load(LAM + l_off, mask=row_ok, other=0.0).to(tl.float32)
    elif LAM_MODE == 1:
        offs_d = tl.arange(0, HEAD_D)
        e1 = tl.exp(tl.sum(tl.load(LQ1 + offs_d).to(tl.float32) * tl.load(LK1 + offs_d).to(tl.float32), 0))
        e2 = tl.exp(tl.sum(tl.load(LQ2 + offs_d).to(tl.float32) * tl.load(LK2 + offs_d).to(tl.float32), 0))
        w1 = tl.where(row_ok, 1.0, 0.0)
        lam = tl.where(row_ok, e1 - e2 + lam_init, 0.0)
    else:
        g = tl.sigmoid(tl.load(W1 + w_off, mask=row_ok, other=0.0).to(tl.float32))
        g = tl.where(row_ok, g, 0.0)
        if LAM_MODE == 2:
            w1 = g
            lam = tl.where(row_ok, 1.0 - g, 0.0)
        else:
            w1 = tl.where(row_ok, 1.0, 0.0)
            lam = g
    return w1, lam


@triton.jit
def _norm_weight(NW, norm_scale, HEAD_DV: tl.constexpr, NORM_AFFINE: tl.constexpr):
    """w ⊙ s as a (DV,) fp32 vector: the sub-norm's weight times s = ``norm_scale`` (s alone without a weight)."""
    if NORM_AFFINE:
        return tl.load(NW + tl.arange(0, HEAD_DV)).to(tl.float32) * norm_scale
    return tl.full([HEAD_DV], norm_scale, tl.float32)


@triton.jit
def _sub_norm(o, nws, eps, HEAD_DV: tl.constexpr):
    """RMSNorm of each row of o (BLOCK_M, DV) times ``nws`` = w ⊙ s (:func:`_norm_weight`): the per-head sub-norm ×
    (1 − λ_init) of Ye et al. 2024 §2.1. Returns (y, x̂ = o · rstd, rstd)."""
    rstd = tl.rsqrt(tl.sum(o * o, 1) / HEAD_DV + eps)  # (BLOCK_M,)
    xh = o * rstd[:, None]
    return xh * nws[None, :], xh, rstd


@triton.jit
def _diff_attn_fwd_kernel(
    Q1, Q2, K1, K2, V, KB, W1, LAM, LQ1, LK1, LQ2, LK2, NW,  # inputs
    O, O1, O2, LSE1, LSE2,  # outputs
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_wb, stride_wh, stride_wm,
    stride_lb, stride_lh, stride_lm,
    stride_kbb,
    stride_ob, stride_oh, stride_om,
    H, Nq, Nk, qk_scale, lam_init, norm_scale, eps,
    GROUPS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_KB: tl.constexpr, STORE_BRANCHES: tl.constexpr, PREC: tl.constexpr,
    LAM_MODE: tl.constexpr, NORM: tl.constexpr, NORM_AFFINE: tl.constexpr,
):
    start_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hk = h // GROUPS  # GQA: query head h reads kv head h // (H / Hkv)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    offs_dv = tl.arange(0, HEAD_DV)
    row_ok = offs_m < Nq

    q_ptrs = b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
    q1 = tl.load(Q1 + q_ptrs, mask=row_ok[:, None], other=0.0)  # (BLOCK_M, D)
    q2 = tl.load(Q2 + q_ptrs, mask=row_ok[:, None], other=0.0)
    k_base = b * stride_kb + hk * stride_kh
    v_base = b * stride_vb + hk * stride_vh

    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.zeros([BLOCK_M], tl.float32)
    l2 = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, HEAD_DV], tl.float32)
    acc2 = tl.zeros([BLOCK_M, HEAD_DV], tl.float32)

    hi = Nk
    if IS_CAUSAL:  # the last row of this tile sees keys j ≤ start_m·BLOCK_M + BLOCK_M − 1 + (Nk − Nq)
        hi = tl.maximum(tl.minimum(Nk, (start_m + 1) * BLOCK_M + Nk - Nq), 0)
    for start_n in range(0, hi, BLOCK_N):
        offs_kn = start_n + offs_n
        col_ok = offs_kn < Nk
        k_ptrs = k_base + offs_kn[:, None] * stride_kn + offs_d[None, :]
        k1 = tl.load(K1 + k_ptrs, mask=col_ok[:, None], other=0.0)  # (BLOCK_N, D)
        k2 = tl.load(K2 + k_ptrs, mask=col_ok[:, None], other=0.0)
        v = tl.load(V + v_base + offs_kn[:, None] * stride_vn + offs_dv[None, :], mask=col_ok[:, None],
                    other=0.0)  # (BLOCK_N, DV)
        # per-key bias (log2 units): key padding and the ragged last tile; −inf removes a key
        if HAS_KB:
            kb = tl.load(KB + b * stride_kbb + offs_kn, mask=col_ok, other=float("-inf"))
        else:
            kb = tl.where(col_ok, 0.0, float("-inf"))
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale + kb[None, :]  # (BLOCK_M, BLOCK_N)
        s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale + kb[None, :]
        if IS_CAUSAL:
            # only tiles that cross the diagonal need the mask (their first row does not see every key)
            if start_m * BLOCK_M + (Nk - Nq) < start_n + BLOCK_N - 1:
                keep = offs_kn[None, :] <= offs_m[:, None] + (Nk - Nq)
                s1 = tl.where(keep, s1, float("-inf"))
                s2 = tl.where(keep, s2, float("-inf"))
        m1, l1, acc1 = _online_softmax_step(s1, m1, l1, acc1, v, PREC)
        m2, l2, acc2 = _online_softmax_step(s2, m2, l2, acc2, v, PREC)

    # a fully masked row has l = 0 and acc = 0: its output is exactly 0
    l1_safe = tl.where(l1 == 0.0, 1.0, l1)
    l2_safe = tl.where(l2 == 0.0, 1.0, l2)
    o1 = acc1 / l1_safe[:, None]  # (BLOCK_M, DV) = A1 V
    o2 = acc2 / l2_safe[:, None]  # (BLOCK_M, DV) = A2 V
    w1, lam = _row_weights(W1, LAM, LQ1, LK1, LQ2, LK2, lam_init,
                           b * stride_wb + h * stride_wh + offs_m * stride_wm,
                           b * stride_lb + h * stride_lh + offs_m * stride_lm, row_ok, HEAD_D, LAM_MODE)
    o = w1[:, None] * o1 - lam[:, None] * o2  # (BLOCK_M, DV)
    if NORM:
        o, _xh, _rstd = _sub_norm(o, _norm_weight(NW, norm_scale, HEAD_DV, NORM_AFFINE), eps, HEAD_DV)

    o_ptrs = b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_dv[None, :]
    tl.store(O + o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])
    if STORE_BRANCHES:
        ob_ptrs = ((b * H + h) * Nq + offs_m[:, None]) * HEAD_DV + offs_dv[None, :]  # (B, H, Nq, DV) contiguous
        tl.store(O1 + ob_ptrs, o1.to(O1.dtype.element_ty), mask=row_ok[:, None])
        tl.store(O2 + ob_ptrs, o2.to(O2.dtype.element_ty), mask=row_ok[:, None])
        # log2-sum-exp; 0 for fully masked rows (their scores are all −inf, so P = exp2(−inf − 0) = 0)
        lse_ptrs = (b * H + h) * Nq + offs_m
        tl.store(LSE1 + lse_ptrs, tl.where(l1 == 0.0, 0.0, m1 + tl.math.log2(l1_safe)), mask=row_ok)
        tl.store(LSE2 + lse_ptrs, tl.where(l2 == 0.0, 0.0, m2 + tl.math.log2(l2_safe)), mask=row_ok)


@triton.jit
def _diff_attn_bwd_preprocess_kernel(
    O1, O2, DY, DO, R1, R2, W1, LAM, LQ1, LK1, LQ2, LK2, NW, DZ, PART,
    stride_yb, stride_yh, stride_ym,
    stride_wb, stride_wh, stride_wm,
    stride_lb, stride_lh, stride_lm,
    H, Nq, NROWS, NPROG, lam_init, norm_scale, eps,
    HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_M: tl.constexpr,
    LAM_MODE: tl.constexpr, NORM: tl.constexpr, NORM_AFFINE: tl.constexpr, WRITE_DO: tl.constexpr,
    WRITE_DZ: tl.constexpr,
):
    """r_b = rowsum(dO ⊙ O_b) over the B·H·Nq rows (O_b contiguous (B, H, Nq, DV)); the program strides over
    row blocks. dO is the gradient of the combined output: dY itself, or, with the sub-norm fused (``NORM``),

        x̂ = O · rstd,  ĝ = dY ⊙ w · s,  dO = rstd · (ĝ − x̂ · ⟨ĝ, x̂⟩ / DV),   O = w1 ⊙ O1 − λ ⊙ O2

    written to DO (contiguous) when ``WRITE_DO``. Gradients of what produced w1 and λ in the kernel:
    mode 2 (gate) dz = (r_1 + r_2) · g (1 − g); mode 3 (V2) dz = −r_2 · σ (1 − σ), stored per row in DZ; mode 1 (the
    reparam vectors) the program's share of ∂L/∂λ = −Σ r_2, and with an affine norm its share of
    ∂L/∂w = s · Σ_rows dY ⊙ x̂, in PART[program] = (∂λ, ∂w[0:DV]) for :func:`_diff_attn_bwd_finalize_kernel`."""
    pid = tl.program_id(0)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, HEAD_DV)
    acc_lam = tl.zeros([BLOCK_M], tl.float32)
    acc_nw = tl.zeros([HEAD_DV], tl.float32)
    if NORM:
        nws = _norm_weight(NW, norm_scale, HEAD_DV, NORM_AFFINE)  # (DV,), loaded once per program
    for start in range(pid * BLOCK_M, NROWS, NPROG * BLOCK_M):
        offs = (start + offs_m0).to(tl.int64)
        ok = offs < NROWS
        m = offs % Nq
        b = offs // Nq // H
        h = (offs // Nq) % H
        ptrs = offs[:, None] * HEAD_DV + offs_dv[None, :]
        o1 = tl.load(O1 + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
        o2 = tl.load(O2 + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
        dy = tl.load(DY + (b * stride_yb + h * stride_yh + m * stride_ym)[:, None] + offs_dv[None, :],
                     mask=ok[:, None], other=0.0).to(tl.float32)
        w_off = b * stride_wb + h * stride_wh + m * stride_wm
        w1, lam = _row_weights(W1, LAM, LQ1, LK1, LQ2, LK2, lam_init, w_off,
                               b * stride_lb + h * stride_lh + m * stride_lm, ok, HEAD_D, LAM_MODE)
        do = dy
        if NORM:
            _y, xh, rstd = _sub_norm(w1[:, None] * o1 - lam[:, None] * o2, nws, eps, HEAD_DV)
            gw = dy * nws[None, :]
            if NORM_AFFINE:
                acc_nw += tl.sum(dy * xh, 0)
            do = rstd[:, None] * (gw - xh * (tl.sum(gw * xh, 1) / HEAD_DV)[:, None])
        if WRITE_DO:
            tl.store(DO + ptrs, do.to(DO.dtype.element_ty), mask=ok[:, None])
        r1 = tl.sum(do * o1, 1)
        r2 = tl.sum(do * o2, 1)
        tl.store(R1 + offs, r1, mask=ok)
        tl.store(R2 + offs, r2, mask=ok)
        if LAM_MODE == 1:
            acc_lam += tl.where(ok, -r2, 0.0)
        if LAM_MODE == 2 and WRITE_DZ:  # w1 = g, λ = 1 − g
            tl.store(DZ + w_off, ((r1 + r2) * w1 * lam).to(DZ.dtype.element_ty), mask=ok)
        if LAM_MODE == 3 and WRITE_DZ:  # λ = σ(z)
            tl.store(DZ + w_off, (-r2 * lam * (1.0 - lam)).to(DZ.dtype.element_ty), mask=ok)
    if LAM_MODE == 1:
        tl.store(PART + pid * (HEAD_DV + 1), tl.sum(acc_lam, 0))
    if NORM_AFFINE:
        tl.store(PART + pid * (HEAD_DV + 1) + 1 + offs_dv, acc_nw * norm_scale)


@triton.jit
def _diff_attn_bwd_finalize_kernel(
    PART, LQ1, LK1, LQ2, LK2, DLP, DNW, NPROG,
    HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_P: tl.constexpr,
    LAM_MODE: tl.constexpr, NORM_AFFINE: tl.constexpr,
):
    """One program: sums the preprocess programs' shares (in a fixed order, so the result is deterministic) into
    ∂L/∂w of the sub-norm (DNW) and, in λ mode 1, ∂L/∂λ, from which the reparam vectors' gradients follow
    (DLP rows: λ_q1, λ_k1, λ_q2, λ_k2):  ∂λ/∂λ_q1 = e1 λ_k1, ∂λ/∂λ_k1 = e1 λ_q1, ∂λ/∂λ_q2 = −e2 λ_k2,
    ∂λ/∂λ_k2 = −e2 λ_q2 with e_b = exp(λ_qb·λ_kb)."""
    offs_p0 = tl.arange(0, BLOCK_P)
    offs_dv = tl.arange(0, HEAD_DV)
    acc_lam = tl.zeros([BLOCK_P], tl.float32)
    acc_nw = tl.zeros([HEAD_DV], tl.float32)
    for p0 in range(0, NPROG, BLOCK_P):
        offs_p = p0 + offs_p0
        okp = offs_p < NPROG
        if LAM_MODE == 1:
            acc_lam += tl.load(PART + offs_p * (HEAD_DV + 1), mask=okp, other=0.0)
        if NORM_AFFINE:
            acc_nw += tl.sum(tl.load(PART + offs_p[:, None] * (HEAD_DV + 1) + 1 + offs_dv[None, :],
                                     mask=okp[:, None], other=0.0), 0)
    if NORM_AFFINE:
        tl.store(DNW + offs_dv, acc_nw.to(DNW.dtype.element_ty))
    if LAM_MODE == 1:
        dlam = tl.sum(acc_lam, 0)
        offs_d = tl.arange(0, HEAD_D)
        q1 = tl.load(LQ1 + offs_d).to(tl.float32)
        k1 = tl.load(LK1 + offs_d).to(tl.float32)
        q2 = tl.load(LQ2 + offs_d).to(tl.float32)
        k2 = tl.load(LK2 + offs_d).to(tl.float32)
        c1 = dlam * tl.exp(tl.sum(q1 * k1, 0))
        c2 = -dlam * tl.exp(tl.sum(q2 * k2, 0))
        tl.store(DLP + offs_d, (c1 * k1).to(DLP.dtype.element_ty))
        tl.store(DLP + HEAD_D + offs_d, (c1 * q1).to(DLP.dtype.element_ty))
        tl.store(DLP + 2 * HEAD_D + offs_d, (c2 * k2).to(DLP.dtype.element_ty))
        tl.store(DLP + 3 * HEAD_D + offs_d, (c2 * q2).to(DLP.dtype.element_ty))


@triton.jit
def _diff_attn_bwd_dkdv_kernel(
    Q1, Q2, K1, K2, V, KB, W1, LAM, LQ1, LK1, LQ2, LK2, DO, LSE1, LSE2, R1, R2,  # inputs
    DK1, DK2, DV,  # outputs (B, Hkv, Nk, ·) with the strides below
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_wb, stride_wh, stride_wm,
    stride_lb, stride_lh, stride_lm,
    stride_kbb,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    H, Hkv, Nq, Nk, qk_scale, sm_scale, lam_init,
    GROUPS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_KB: tl.constexpr, PREC: tl.constexpr,
    LAM_MODE: tl.constexpr, K_SHARED: tl.constexpr, PART: tl.constexpr,
):
    """dK1, dK2 and dV of BLOCK_N keys (``PART`` 0); ``PART`` 1 computes dV only and 2 dK1, dK2 only, as two
    launches that each hold fewer accumulators (Q Kᵀ recomputed in both): an option for wide values (dv = 256),
    where one program's dK1, dK2 and dV accumulators exceed the register file."""
    start_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // Hkv).to(tl.int64)
    hk = (pid_bh % Hkv).to(tl.int64)

    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    offs_dv = tl.arange(0, HEAD_DV)
    col_ok = offs_n < Nk

    k_ptrs = b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    k1 = tl.load(K1 + k_ptrs, mask=col_ok[:, None], other=0.0)  # (BLOCK_N, D)
    k2 = tl.load(K2 + k_ptrs, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_dv[None, :],
                mask=col_ok[:, None], other=0.0)  # (BLOCK_N, DV)
    if HAS_KB:
        kb = tl.load(KB + b * stride_kbb + offs_n, mask=col_ok, other=float("-inf"))
    else:
        kb = tl.where(col_ok, 0.0, float("-inf"))

    dk1 = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    dk2 = tl.zeros([BLOCK_N, HEAD_D], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DV], tl.float32)

    lo = 0
    if IS_CAUSAL:  # first query row that sees key start_n·BLOCK_N: i ≥ j − (Nk − Nq)
        lo = tl.maximum(start_n * BLOCK_N - (Nk - Nq), 0)
        lo = (lo // BLOCK_M) * BLOCK_M
    for g in range(GROUPS):  # the query heads that share this kv head
        h = hk * GROUPS + g
        q_base = b * stride_qb + h * stride_qh
        row_base = (b * H + h) * Nq
        for start_m in range(lo, Nq, BLOCK_M):
            offs_m = start_m + offs_m0
            row_ok = offs_m < Nq
            q_ptrs = q_base + offs_m[:, None] * stride_qm + offs_d[None, :]
            q1 = tl.load(Q1 + q_ptrs, mask=row_ok[:, None], other=0.0)  # (BLOCK_M, D)
            q2 = tl.load(Q2 + q_ptrs, mask=row_ok[:, None], other=0.0)
            do = tl.load(DO + (row_base + offs_m[:, None]) * HEAD_DV + offs_dv[None, :], mask=row_ok[:, None],
                         other=0.0)  # (BLOCK_M, DV)
            # +inf log-sum-exp on padding rows makes their P exactly 0
            lse1 = tl.load(LSE1 + row_base + offs_m, mask=row_ok, other=float("inf"))
            lse2 = tl.load(LSE2 + row_base + offs_m, mask=row_ok, other=float("inf"))
            r1 = tl.load(R1 + row_base + offs_m, mask=row_ok, other=0.0)
            r2 = tl.load(R2 + row_base + offs_m, mask=row_ok, other=0.0)
            w1, lam = _row_weights(W1, LAM, LQ1, LK1, LQ2, LK2, lam_init,
                                   b * stride_wb + h * stride_wh + offs_m * stride_wm,
                                   b * stride_lb + h * stride_lh + offs_m * stride_lm, row_ok, HEAD_D, LAM_MODE)

            # transposed tiles (BLOCK_N, BLOCK_M), as in the Triton FA-2 tutorial: no transpose of P or dS
            s1t = tl.dot(k1, tl.trans(q1), input_precision=PREC) * qk_scale + kb[:, None]
            s2t = tl.dot(k2, tl.trans(q2), input_precision=PREC) * qk_scale + kb[:, None]
            if IS_CAUSAL:
                if start_m + (Nk - Nq) < start_n * BLOCK_N + BLOCK_N - 1:  # a tile crossing the diagonal
                    keep = offs_n[:, None] <= offs_m[None, :] + (Nk - Nq)
                    s1t = tl.where(keep, s1t, float("-inf"))
                    s2t = tl.where(keep, s2t, float("-inf"))
            p1t = tl.math.exp2(s1t - lse1[None, :])  # P1ᵀ
            p2t = tl.math.exp2(s2t - lse2[None, :])  # P2ᵀ
            # dV += (w1 ⊙ P1 − λ ⊙ P2)ᵀ dO
            if PART != 2:
                pct = p1t * w1[None, :] - p2t * lam[None, :]
                dv += tl.dot(pct.to(do.dtype), do, input_precision=PREC)
            if PART != 1:
                # dPᵀ = V dOᵀ, shared by both branches
                dpt = tl.dot(v, tl.trans(do), input_precision=PREC)  # (BLOCK_N, BLOCK_M)
                ds1t = p1t * (dpt - r1[None, :]) * w1[None, :]
                ds2t = p2t * (dpt - r2[None, :]) * (-lam[None, :])
                dk1 += tl.dot(ds1t.to(q1.dtype), q1, input_precision=PREC)  # (BLOCK_N, D)
                dk2 += tl.dot(ds2t.to(q2.dtype), q2, input_precision=PREC)

    dk_ptrs = b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :]
    if PART != 1:
        if K_SHARED:  # one K read by both branches (Diff Transformer V2): its gradient is the sum
            tl.store(DK1 + dk_ptrs, ((dk1 + dk2) * sm_scale).to(DK1.dtype.element_ty), mask=col_ok[:, None])
        else:
            tl.store(DK1 + dk_ptrs, (dk1 * sm_scale).to(DK1.dtype.element_ty), mask=col_ok[:, None])
            tl.store(DK2 + dk_ptrs, (dk2 * sm_scale).to(DK2.dtype.element_ty), mask=col_ok[:, None])
    if PART != 2:
        tl.store(DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_dv[None, :],
                 dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _diff_attn_bwd_dq_kernel(
    Q1, Q2, K1, K2, V, KB, W1, LAM, LQ1, LK1, LQ2, LK2, DO, LSE1, LSE2, R1, R2,  # inputs
    DQ1, DQ2,  # outputs (B, H, Nq, D) with the strides below
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_wb, stride_wh, stride_wm,
    stride_lb, stride_lh, stride_lm,
    stride_kbb,
    stride_dqb, stride_dqh, stride_dqm,
    H, Nq, Nk, qk_scale, sm_scale, lam_init,
    GROUPS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_KB: tl.constexpr, PREC: tl.constexpr,
    LAM_MODE: tl.constexpr,
):
    start_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hk = h // GROUPS

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    offs_dv = tl.arange(0, HEAD_DV)
    row_ok = offs_m < Nq
    row_base = (b * H + h) * Nq

    q_ptrs = b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
    q1 = tl.load(Q1 + q_ptrs, mask=row_ok[:, None], other=0.0)  # (BLOCK_M, D)
    q2 = tl.load(Q2 + q_ptrs, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + (row_base + offs_m[:, None]) * HEAD_DV + offs_dv[None, :], mask=row_ok[:, None],
                 other=0.0)  # (BLOCK_M, DV)
    lse1 = tl.load(LSE1 + row_base + offs_m, mask=row_ok, other=float("inf"))
    lse2 = tl.load(LSE2 + row_base + offs_m, mask=row_ok, other=float("inf"))
    r1 = tl.load(R1 + row_base + offs_m, mask=row_ok, other=0.0)
    r2 = tl.load(R2 + row_base + offs_m, mask=row_ok, other=0.0)
    w1, lam = _row_weights(W1, LAM, LQ1, LK1, LQ2, LK2, lam_init,
                           b * stride_wb + h * stride_wh + offs_m * stride_wm,
                           b * stride_lb + h * stride_lh + offs_m * stride_lm, row_ok, HEAD_D, LAM_MODE)
    k_base = b * stride_kb + hk * stride_kh
    v_base = b * stride_vb + hk * stride_vh

    dq1 = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    dq2 = tl.zeros([BLOCK_M, HEAD_D], tl.float32)

    hi = Nk
    if IS_CAUSAL:
        hi = tl.maximum(tl.minimum(Nk, (start_m + 1) * BLOCK_M + Nk - Nq), 0)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        col_ok = offs_n < Nk
        k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :]
        k1 = tl.load(K1 + k_ptrs, mask=col_ok[:, None], other=0.0)  # (BLOCK_N, D)
        k2 = tl.load(K2 + k_ptrs, mask=col_ok[:, None], other=0.0)
        v = tl.load(V + v_base + offs_n[:, None] * stride_vn + offs_dv[None, :], mask=col_ok[:, None],
                    other=0.0)  # (BLOCK_N, DV)
        if HAS_KB:
            kb = tl.load(KB + b * stride_kbb + offs_n, mask=col_ok, other=float("-inf"))
        else:
            kb = tl.where(col_ok, 0.0, float("-inf"))
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale + kb[None, :]  # (BLOCK_M, BLOCK_N)
        s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale + kb[None, :]
        if IS_CAUSAL:
            if start_m * BLOCK_M + (Nk - Nq) < start_n + BLOCK_N - 1:  # a tile crossing the diagonal
                keep = offs_n[None, :] <= offs_m[:, None] + (Nk - Nq)
                s1 = tl.where(keep, s1, float("-inf"))
                s2 = tl.where(keep, s2, float("-inf"))
        p1 = tl.math.exp2(s1 - lse1[:, None])
        p2 = tl.math.exp2(s2 - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)  # (BLOCK_M, BLOCK_N), shared by both branches
        ds1 = p1 * (dp - r1[:, None]) * w1[:, None]
        ds2 = p2 * (dp - r2[:, None]) * (-lam[:, None])
        dq1 += tl.dot(ds1.to(k1.dtype), k1, input_precision=PREC)  # (BLOCK_M, D)
        dq2 += tl.dot(ds2.to(k2.dtype), k2, input_precision=PREC)

    dq_ptrs = b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :]
    tl.store(DQ1 + dq_ptrs, (dq1 * sm_scale).to(DQ1.dtype.element_ty), mask=row_ok[:, None])
    tl.store(DQ2 + dq_ptrs, (dq2 * sm_scale).to(DQ2.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------------------- block sizes


@dataclass(frozen=True)
class _Tiles:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def _tiles(d: int, dv: int, dtype: torch.dtype) -> tuple[_Tiles, _Tiles, _Tiles]:
    """Tile sizes (forward, dK/dV, dQ) for head width d and value width dv; BLOCK_N is the key tile.

    A program keeps two fp32 accumulators of width dv (forward: 2·BLOCK_M·dv values; dK/dV: BLOCK_N·(2d +
    dv)), so the register file, not the matmul shape, sets the tile size: the forward at d = 64, dv = 128
    holds as many accumulator values as FlashAttention-2 at head width 256. The shapes d × dv = 64 × 128,
    128 × 256, 32 × 64 and 64 × 64 were chosen by measurement: ``benchmarks/kernel.py --tune`` timed each kernel's
    candidates on an NVIDIA H200 (bf16, N = 4096, non-causal; docs/benchmarks.md gives the runs) and the fastest
    that also compiles for the causal mask is in ``_MEASURED_TILES`` (at 128 × 256 a 3-stage forward was 8 %
    faster but needs 237,568 bytes of shared memory when causal, over the H200's 232,448). The backward kernels
    ran up to 2.3× faster with 4 warps and small tiles than with the 8 warps that ptxas' spill reports had
    suggested.
    Other shapes keep the largest tiles for which ptxas reported no register spills for sm_90 (8 warps, 2
    stages). float32 inputs (tiles twice the bytes, 3×TF32 matmuls) use 32×32 tiles and one stage: a correctness
    path, not a fast one. In the interpreter, 16×16 tiles: its speed is set by the number of numpy calls, and
    small tiles exercise multi-tile loops, diagonal causal tiles and ragged edges on tiny test shapes.
    """
    if _interpreting():
        t = _Tiles(16, 16, 1, 1)
        return t, t, t
    if dtype != torch.float32 and (d, dv) in _TILE_OVERRIDES:
        return _TILE_OVERRIDES[(d, dv)]
    if dtype == torch.float32:
        t = _Tiles(32, 32, 4, 1)
        return t, t, t
    if (d, dv) in _MEASURED_TILES:
        return _MEASURED_TILES[(d, dv)]
    if dv <= 64:  # d ≤ 64
        return _Tiles(128, 64, 8, 2), _Tiles(32, 64, 8, 2), _Tiles(128, 32, 8, 2)
    if d <= 64:  # d ≤ 64, dv = 2d
        return _Tiles(128, 64, 8, 2), _Tiles(64, 32, 8, 2), _Tiles(128, 32, 8, 2)
    if dv <= 128:  # d = dv = 128
        return _Tiles(64, 64, 8, 2), _Tiles(64, 32, 8, 2), _Tiles(64, 32, 8, 2)
    return _Tiles(64, 32, 8, 2), _Tiles(32, 32, 8, 2), _Tiles(64, 32, 8, 2)  # d = 128, dv = 256


#: (d, dv) → (forward, dK/dV, dQ) tiles chosen by timing on an NVIDIA H200 (``benchmarks/kernel.py --tune``)
_MEASURED_TILES: dict[tuple[int, int], tuple[_Tiles, _Tiles, _Tiles]] = {
    (64, 128): (_Tiles(128, 64, 8, 3), _Tiles(32, 64, 4, 2), _Tiles(64, 64, 4, 2)),
    (128, 256): (_Tiles(64, 64, 8, 2), _Tiles(32, 32, 4, 2), _Tiles(128, 32, 8, 2)),
    (32, 64): (_Tiles(64, 64, 4, 3), _Tiles(64, 64, 4, 2), _Tiles(64, 32, 4, 2)),
    (64, 64): (_Tiles(64, 64, 4, 3), _Tiles(32, 64, 4, 2), _Tiles(64, 64, 4, 2)),
}


#: (d, dv) → (forward, dK/dV, dQ) tiles for fp16/bf16 that replace the table above; set by :func:`override_tiles`
_TILE_OVERRIDES: dict[tuple[int, int], tuple[_Tiles, _Tiles, _Tiles]] = {}


@contextlib.contextmanager
def override_tiles(d: int, dv: int, fwd: _Tiles, dkdv: _Tiles, dq: _Tiles):
    """Within the block, fp16/bf16 calls at head width ``d`` and value width ``dv`` use these tiles (for tuning
    sweeps and benchmarks: ``benchmarks/kernel.py --tune``)."""
    old = _TILE_OVERRIDES.get((d, dv))
    _TILE_OVERRIDES[(d, dv)] = (fwd, dkdv, dq)
    try:
        yield
    finally:
        if old is None:
            del _TILE_OVERRIDES[(d, dv)]
        else:
            _TILE_OVERRIDES[(d, dv)] = old


#: (d, dv) whose dK/dV backward runs as two launches (dV, then dK1 and dK2; :func:`_diff_attn_bwd_dkdv_kernel`'s
#: ``PART``). Empty: no shape has been measured faster split; set by :func:`split_dkdv` for measurements
_SPLIT_DKDV: set[tuple[int, int]] = set()


def _split_dkdv(d: int, dv: int) -> bool:
    return (d, dv) in _SPLIT_DKDV


@contextlib.contextmanager
def split_dkdv(d: int, dv: int, on: bool = True):
    """Within the block, the dK/dV backward at head width ``d`` and value width ``dv`` runs as two launches (dV,
    then dK1 and dK2), each holding fewer accumulators, with Q Kᵀ recomputed in both (for measurements:
    ``benchmarks/gpu_goals.py core`` times it as ``diff_triton_split``)."""
    had = (d, dv) in _SPLIT_DKDV
    (_SPLIT_DKDV.add if on else _SPLIT_DKDV.discard)((d, dv))
    try:
        yield
    finally:
        (_SPLIT_DKDV.add if had else _SPLIT_DKDV.discard)((d, dv))


# --------------------------------------------------------------------------------------------- helpers


def _precision(dtype: torch.dtype) -> str:
    """tl.dot input precision: float32 inputs get 3×TF32 (about fp32 accuracy on tensor cores, where IEEE
    fp32 matmuls fall back to FMA loops that spill); it has no effect on fp16/bf16 inputs."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _as_tensor(w: Weight, device: torch.device) -> torch.Tensor:
    """A weight as a tensor for the operators: floats become 0-D fp32 tensors (which get no gradient), kept
    per value and device in eager mode so that a layer's constant weight costs no fill kernel per call."""
    if isinstance(w, torch.Tensor):
        return w
    if torch.compiler.is_compiling():
        return torch.full((), float(w), dtype=torch.float32, device=device)
    key = (float(w), str(device))
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) > 64:
            _CONSTANTS.clear()
        with torch.inference_mode(False):  # a normal tensor even when first made under inference mode
            t = _CONSTANTS[key] = torch.full((), key[0], dtype=torch.float32, device=device)
    return t


_CONSTANTS: dict[tuple[float, str], torch.Tensor] = {}


def _row_weight(w: Weight, B: int, H: int, Nq: int, device: torch.device) -> torch.Tensor:
    """A float or a tensor broadcastable to (B, H, Nq, 1) as an fp32 (B, H, Nq) view (stride 0: no copy)."""
    if isinstance(w, torch.Tensor):
        return w.detach().float().broadcast_to((B, H, Nq, 1))[..., 0]
    return torch.full((1, 1, 1), float(w), dtype=torch.float32, device=device).expand(B, H, Nq)


def _mask_as_key_bias(attn_mask: torch.Tensor, B: int, Nk: int) -> torch.Tensor:
    """A key-padding mask as an fp32 (B or 1, Nk) additive bias in log2 units; blocked keys are −inf."""
    m = attn_mask.detach()
    m = m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))[:, 0, 0, :]  # (1 or B, 1 or Nk)
    if m.dtype == torch.bool:
        bias = torch.zeros(m.shape, dtype=torch.float32, device=m.device).masked_fill(~m, float("-inf"))
    else:  # blocked entries as the operator reads them (diffattn.ops.masks.blocked); finite ones clamped to fp32 range
        info = torch.finfo(torch.float32)
        wide = m.clamp(info.min, info.max) if torch.finfo(m.dtype).max > info.max else m
        bias = wide.float().masked_fill(blocked(m), float("-inf")) * LOG2E
    return bias.expand(bias.shape[0], Nk).contiguous()


def _key_padding_reason(attn_mask: torch.Tensor, B: int, H: int, Nq: int, Nk: int) -> str | None:
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        return f"attn_mask must be bool or floating point, got dtype {attn_mask.dtype}"
    if attn_mask.dim() > 4:
        return f"attn_mask must have at most 4 dims, got shape {tuple(attn_mask.shape)}"
    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)  # right-aligned, as in broadcasting
    if shape[0] not in (1, B) or shape[3] not in (1, Nk):
        return (f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (B, H, Nq, Nk) = "
                f"{(B, H, Nq, Nk)}")
    if shape[1] != 1 or shape[2] != 1:
        return (f"the triton kernel supports key-padding masks only (one row of Nk values per batch "
                f"element, e.g. (B, 1, 1, Nk)); attn_mask of shape {tuple(attn_mask.shape)} varies over "
                f"heads or queries")
    if attn_mask.requires_grad:
        return "the triton kernel does not compute a gradient for attn_mask"
    return None


def _weight_reason(name: str, w, B: int, H: int, Nq: int, device: torch.device) -> str | None:
    if isinstance(w, bool) or not isinstance(w, (int, float, torch.Tensor)):
        return f"{name} must be a float or a tensor, got {type(w).__name__}"
    if not isinstance(w, torch.Tensor):
        return None
    if not w.is_floating_point():
        return f"{name} must be a floating tensor, got dtype {w.dtype}"
    if w.device != device:
        return f"{name} is on {w.device} but the inputs are on {device}"
    shape = tuple(w.shape)
    if len(shape) > 4 or any(s not in (1, t) for s, t in zip(reversed(shape), reversed((B, H, Nq, 1)))):
        return f"{name} of shape {shape} does not broadcast to (B, H, Nq, 1) = {(B, H, Nq, 1)}"
    return None


def _check(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p) -> str | None:
    names = ("q1", "k1", "q2", "k2", "v")
    for name, t in zip(names, (q1, k1, q2, k2, v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            return f"{name} must be a 4-D tensor"
    device = q1.device
    if any(t.device != device for t in (k1, q2, k2, v)):
        return "q1, k1, q2, k2 and v must be on one device"
    if device.type != "cuda" and not (_interpreting() and device.type == "cpu"):
        return (f"the triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 with CPU tensors), "
                f"got device {device.type}")
    dtype = q1.dtype
    if any(t.dtype != dtype for t in (k1, q2, k2, v)):
        return "q1, k1, q2, k2 and v must share one dtype"
    if dtype not in SUPPORTED_DTYPES:
        return f"dtype {dtype} is not supported (float16, bfloat16, float32)"
    if _interpreting() and dtype != torch.float32:
        return f"the Triton interpreter runs float32 only, got {dtype}"
    if dropout_p != 0.0:
        return f"the triton kernel has no attention dropout (dropout_p={dropout_p})"
    if not isinstance(is_causal, bool):
        return f"is_causal must be a bool, got {type(is_causal).__name__}"
    if q1.shape != q2.shape or k1.shape != k2.shape:
        return "q1/q2 and k1/k2 must have the same shapes"
    B, H, Nq, d = q1.shape
    Bk, Hkv, Nk, dk = k1.shape
    if Bk != B or dk != d or tuple(v.shape[:3]) != (B, Hkv, Nk):
        return (f"shapes do not match: q {tuple(q1.shape)}, k {tuple(k1.shape)}, v {tuple(v.shape)} "
                f"(expected (B, H, Nq, d), (B, Hkv, Nk, d), (B, Hkv, Nk, dv))")
    if Hkv == 0 or H % Hkv != 0:
        return f"the query head count H={H} must be a multiple of the key/value head count Hkv={Hkv}"
    if min(B, H, Nq, Nk) == 0:
        return f"empty inputs: q {tuple(q1.shape)}, k {tuple(k1.shape)}"
    if d not in SUPPORTED_HEAD_DIMS:
        return f"head width d={d} is not supported (one of {SUPPORTED_HEAD_DIMS})"
    dv = v.shape[-1]
    if dv not in (d, 2 * d):
        return f"value width dv={dv} must be d={d} or 2d={2 * d}"
    for name, w in (("lambda_", lambda_), ("weight1", weight1)):
        reason = _weight_reason(name, w, B, H, Nq, device)
        if reason is not None:
            return reason
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            return f"attn_mask must be a tensor, got {type(attn_mask).__name__}"
        if attn_mask.device != device:
            return f"attn_mask is on {attn_mask.device} but the inputs are on {device}"
        return _key_padding_reason(attn_mask, B, H, Nq, Nk)
    return None


def _unit_stride(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Make the last dim unit-stride and give the tensors one stride set (the kernels share strides)."""
    ts = tuple(t if t.stride(-1) == 1 else t.contiguous() for t in ts)
    if any(t.stride() != ts[0].stride() for t in ts):
        ts = tuple(t.contiguous() for t in ts)
    return ts


def _sum_to(g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Reduce a (B, H, Nq, 1) gradient to the shape ``w`` was broadcast from."""
    g = g.sum() if w.dim() == 0 else g.sum_to_size(w.shape)
    return g.to(w.dtype)


# ------------------------------------------------------------------------------------------- launchers


@dataclass(frozen=True)
class _Epilogue:
    """Where w1 and λ come from (``mode``, see :func:`_row_weights`) and whether the per-head sub-norm runs in the
    kernel: y = RMSNorm(O) ⊙ w · ``norm_scale`` (eps ``eps``; ``affine`` False: no w)."""

    mode: int = 0
    lam_init: float = 0.0
    norm: bool = False
    affine: bool = False
    norm_scale: float = 1.0
    eps: float = 1e-5


_PLAIN = _Epilogue()

#: the preprocess kernel's program count is capped here (each program strides over row blocks), so that the
#: per-program shares of ∂λ and ∂w stay small for the finalize kernel to sum
_MAX_PREPROCESS_PROGRAMS = 1024


def _w_strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _preprocess_grid(B: int, H: int, Nq: int, dv: int, ep: _Epilogue) -> tuple[int, int, int, bool]:
    """(rows, rows per block, programs, whether the finalize kernel runs) of the backward's preprocess."""
    rows = B * H * Nq
    block = 4096 // dv  # three (block, dv) fp32 tiles in registers
    return rows, block, min(triton.cdiv(rows, block), _MAX_PREPROCESS_PROGRAMS), ep.mode == 1 or (ep.norm and ep.affine)


def _work_size(rows: int, nprog: int, dv: int, finalize: bool) -> int:
    """fp32 workspace of the backward: r (2·rows), then each preprocess program's shares of ∂λ and ∂w (1 + dv)."""
    return 2 * rows + (nprog * (dv + 1) if finalize else 0)


def _writes_do(dy: torch.Tensor, ep: _Epilogue) -> bool:
    """Whether the preprocess writes dO to a buffer: the norm's backward changes it, or dY is not contiguous."""
    B, H, Nq, dv = dy.shape
    return ep.norm or dy.stride() != (H * Nq * dv, Nq * dv, dv, 1)


def _carve(device: torch.device, specs: dict) -> dict:
    """Several scratch tensors from one allocation per dtype: ``specs`` maps a name to (shape, dtype, like), with
    ``like`` a tensor whose stride order the result takes (as ``empty_like``) or None (contiguous). Each tensor
    starts on a 128-byte boundary. A training step's scratch then costs one allocator call per dtype, not one
    per tensor (on a GPU each is a host-side op, and a small model's step is bound by those)."""
    sizes: dict[torch.dtype, int] = {}
    places = {}
    for name, (shape, dtype, _like) in specs.items():
        start = sizes.get(dtype, 0)
        places[name] = start
        sizes[dtype] = start + -(-math.prod(shape) // 64) * 64
    bufs = {dt: torch.empty(n, device=device, dtype=dt) for dt, n in sizes.items()}
    out = {}
    for name, (shape, dtype, like) in specs.items():
        flat = bufs[dtype][places[name]:places[name] + math.prod(shape)]
        if like is None:
            out[name] = flat.view(shape)
            continue
        order = sorted(range(len(shape)), key=lambda i: like.stride(i), reverse=True)
        t = flat.view([shape[i] for i in order])
        out[name] = t.permute([order.index(i) for i in range(len(shape))])
    return out


def _fwd_core(q1, k1, q2, k2, v, w1r, lamr, lp, nw, key_bias, o, is_causal: bool, scale: float,
              store_branches: bool, ep: _Epilogue, tiles: _Tiles | None = None, branches=None):
    """Launch the forward kernel, writing O into ``o`` (B, H, Nq, dv), any strides with a unit last one; returns
    (O1, O2, the two log2-sum-exps as one (2, B, H, Nq) fp32 tensor) when ``store_branches``, else three empty
    tensors. ``w1r``/``lamr`` are (B, H, Nq) row views (or, in modes 2–3, w1r the logits), ``lp`` the four reparam
    vectors (mode 1), ``nw`` the sub-norm weight; unused pointers may be any tensor. ``branches`` = (O1, O2,
    log-sum-exps) to write into, allocated here when None."""
    B, H, Nq, d = q1.shape
    Hkv, Nk, dv = k1.shape[1], k1.shape[2], v.shape[-1]
    kb = key_bias if key_bias is not None else q1
    if store_branches and branches is not None:
        o1, o2, lse = branches
        o1_arg, o2_arg, lse_arg = o1, o2, lse
    elif store_branches:
        # two tensors, not views of one: the operator's outputs may not alias each other
        o1 = torch.empty(B, H, Nq, dv, device=q1.device, dtype=v.dtype)
        o2 = torch.empty_like(o1)
        lse = torch.empty(2, B, H, Nq, device=q1.device, dtype=torch.float32)
        o1_arg, o2_arg, lse_arg = o1, o2, lse
    else:  # inference: write O only (the kernel never touches the branch pointers)
        o1, o2, lse = (q1.new_empty(0, dtype=torch.float32) for _ in range(3))  # distinct: outputs never alias
        o1_arg, o2_arg, lse_arg = o, o, (o, o)
    fwd = tiles or _tiles(d, dv, q1.dtype)[0]
    grid = (triton.cdiv(Nq, fwd.block_m), B * H)
    _diff_attn_fwd_kernel[grid](
        q1, q2, k1, k2, v, kb, w1r, lamr, *lp, nw,
        o, o1_arg, o2_arg, lse_arg[0], lse_arg[1],
        q1.stride(0), q1.stride(1), q1.stride(2),
        k1.stride(0), k1.stride(1), k1.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        *_w_strides(w1r), *_w_strides(lamr),
        kb.stride(0) if key_bias is not None and kb.shape[0] > 1 else 0,
        o.stride(0), o.stride(1), o.stride(2),
        H, Nq, Nk, scale * LOG2E, ep.lam_init, ep.norm_scale, ep.eps,
        GROUPS=H // Hkv, HEAD_D=d, HEAD_DV=dv, BLOCK_M=fwd.block_m, BLOCK_N=fwd.block_n,
        IS_CAUSAL=is_causal, HAS_KB=key_bias is not None, STORE_BRANCHES=store_branches,
        PREC=_precision(q1.dtype), LAM_MODE=ep.mode, NORM=ep.norm, NORM_AFFINE=ep.affine,
        num_warps=fwd.num_warps, num_stages=fwd.num_stages,
    )
    return o1, o2, lse


def _bwd_core(dy, q1, k1, q2, k2, v, o1, o2, lse, w1r, lamr, lp, nw, dz, key_bias, dq1, dq2, dk1, dk2, dvv,
              is_causal: bool, scale: float, ep: _Epilogue, k_shared: bool = False,
              tiles: tuple[_Tiles, _Tiles] | None = None, scratch: dict | None = None):
    """Launch the backward kernels, writing dQ1, dQ2, dK1, dK2 and dV into the given tensors (any strides with a
    unit last one; with ``k_shared`` dK1 receives dK1 + dK2 and dK2 is not written), ∂L/∂z into ``dz`` (modes 2–3;
    None: not computed).
    Returns (r, dlp, dnw): r = (rowsum(dO ⊙ O1), rowsum(dO ⊙ O2)) as (2, B, H, Nq) fp32, the reparam vectors'
    gradients as one (4, d) tensor (mode 1) and the sub-norm weight's gradient (affine norm), or None for each
    of the last two. ``scratch`` holds these tensors preallocated (:func:`_bwd_scratch`): "work", "do" (when
    :func:`_writes_do`), "dlp", "dnw"; missing ones are allocated here."""
    B, H, Nq, d = q1.shape
    Hkv, Nk, dv = k1.shape[1], k1.shape[2], v.shape[-1]
    kb = key_bias if key_bias is not None else q1
    rows, block, nprog, finalize = _preprocess_grid(B, H, Nq, dv, ep)
    scratch = scratch or {}
    work = scratch.get("work")
    if work is None:
        work = torch.empty(_work_size(rows, nprog, dv, finalize), device=q1.device, dtype=torch.float32)
    r = work[:2 * rows].view(2, B, H, Nq)
    write_do = _writes_do(dy, ep)
    do = dy if not write_do else scratch.get("do")
    if do is None:
        do = torch.empty(B, H, Nq, dv, device=q1.device, dtype=v.dtype)
    _diff_attn_bwd_preprocess_kernel[(nprog,)](
        o1, o2, dy, do, r[0], r[1], w1r, lamr, *lp, nw, work if dz is None else dz,
        work[2 * rows:] if finalize else work,
        dy.stride(0), dy.stride(1), dy.stride(2), *_w_strides(w1r), *_w_strides(lamr),
        H, Nq, rows, nprog, ep.lam_init, ep.norm_scale, ep.eps,
        HEAD_D=d, HEAD_DV=dv, BLOCK_M=block, LAM_MODE=ep.mode, NORM=ep.norm, NORM_AFFINE=ep.norm and ep.affine,
        WRITE_DO=write_do, WRITE_DZ=dz is not None)
    dlp = dnw = None
    if finalize:
        dlp = dnw = None
        if ep.mode == 1:
            dlp = scratch.get("dlp")
            dlp = torch.empty(4, d, device=q1.device, dtype=lp[0].dtype) if dlp is None else dlp
        if ep.norm and ep.affine:
            dnw = scratch.get("dnw")
            dnw = torch.empty_like(nw) if dnw is None else dnw
        _diff_attn_bwd_finalize_kernel[(1,)](
            work[2 * rows:], *lp, dlp if dlp is not None else work, dnw if dnw is not None else work, nprog,
            HEAD_D=d, HEAD_DV=dv, BLOCK_P=16, LAM_MODE=ep.mode, NORM_AFFINE=ep.norm and ep.affine)

    tkv, tq = tiles or _tiles(d, dv, q1.dtype)[1:]
    common = dict(GROUPS=H // Hkv, HEAD_D=d, HEAD_DV=dv, IS_CAUSAL=is_causal, HAS_KB=key_bias is not None,
                  PREC=_precision(q1.dtype), LAM_MODE=ep.mode)
    strides = (
        q1.stride(0), q1.stride(1), q1.stride(2),
        k1.stride(0), k1.stride(1), k1.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        *_w_strides(w1r), *_w_strides(lamr),
        kb.stride(0) if key_bias is not None and kb.shape[0] > 1 else 0,
    )
    qk_scale = scale * LOG2E
    lse = lse.contiguous()
    inputs = (q1, q2, k1, k2, v, kb, w1r, lamr, *lp, do, lse[0], lse[1], r[0], r[1])
    # dK1, dK2, dV: one program per key tile and kv head (two launches, dV and dK, where split_dkdv says so)
    for part in ((1, 2) if _split_dkdv(d, dv) else (0,)):
        _diff_attn_bwd_dkdv_kernel[(triton.cdiv(Nk, tkv.block_n), B * Hkv)](
            *inputs, dk1, dk2, dvv, *strides,
            dk1.stride(0), dk1.stride(1), dk1.stride(2), dvv.stride(0), dvv.stride(1), dvv.stride(2),
            H, Hkv, Nq, Nk, qk_scale, scale, ep.lam_init, K_SHARED=k_shared, PART=part,
            BLOCK_M=tkv.block_m, BLOCK_N=tkv.block_n, num_warps=tkv.num_warps, num_stages=tkv.num_stages,
            **common,
        )
    # dQ1, dQ2: one program per query tile and head
    _diff_attn_bwd_dq_kernel[(triton.cdiv(Nq, tq.block_m), B * H)](
        *inputs, dq1, dq2, *strides, dq1.stride(0), dq1.stride(1), dq1.stride(2),
        H, Nq, Nk, qk_scale, scale, ep.lam_init,
        BLOCK_M=tq.block_m, BLOCK_N=tq.block_n, num_warps=tq.num_warps, num_stages=tq.num_stages, **common,
    )
    return r, dlp, dnw


def _fwd_impl(q1, k1, q2, k2, v, lam, w1, key_bias, is_causal: bool, scale: float, store_branches: bool,
              tiles: _Tiles | None = None):
    """The forward of :func:`triton_diff_attention`: O (B, H, Nq, dv), and (when ``store_branches``) O1 = A1 V,
    O2 = A2 V and the two log2-sum-exps as one (2, B, H, Nq) fp32 tensor; without them, three empty tensors.
    ``tiles`` overrides the table."""
    q1, q2 = _unit_stride(q1, q2)
    k1, k2 = _unit_stride(k1, k2)
    (v,) = _unit_stride(v)
    B, H, Nq, _ = q1.shape
    o = torch.empty(B, H, Nq, v.shape[-1], device=q1.device, dtype=v.dtype)
    w1r = _row_weight(w1, B, H, Nq, q1.device)  # (B, H, Nq) fp32 views
    lamr = _row_weight(lam, B, H, Nq, q1.device)
    o1, o2, lse = _fwd_core(q1, k1, q2, k2, v, w1r, lamr, (q1,) * 4, q1, key_bias, o, is_causal, scale,
                            store_branches, _PLAIN, tiles)
    return o, o1, o2, lse


def _bwd_impl(do, q1, k1, q2, k2, v, o1, o2, lse, lam, w1, key_bias, is_causal: bool, scale: float,
              tiles: tuple[_Tiles, _Tiles] | None = None):
    """The backward of :func:`triton_diff_attention`. Returns dQ as one (2, B, H, Nq, d) tensor (dQ1, dQ2), dK as
    one (2, B, Hkv, Nk, d) tensor, dV (B, Hkv, Nk, dv) and r = (rowsum(dO ⊙ O1), rowsum(dO ⊙ O2)) as (2, B, H, Nq)
    fp32, from which the weight gradients follow. ``tiles`` = (dK/dV tiles, dQ tiles) overrides the table."""
    q1, q2 = _unit_stride(q1, q2)
    k1, k2 = _unit_stride(k1, k2)
    (v,) = _unit_stride(v)
    B, H, Nq, d = q1.shape
    w1r = _row_weight(w1, B, H, Nq, q1.device)
    lamr = _row_weight(lam, B, H, Nq, q1.device)
    dq = torch.empty(2, B, H, Nq, d, device=q1.device, dtype=q1.dtype)
    dk = torch.empty(2, *k1.shape, device=q1.device, dtype=k1.dtype)
    dvv = torch.empty(v.shape, device=q1.device, dtype=v.dtype)
    r, _, _ = _bwd_core(do.contiguous(), q1, k1, q2, k2, v, o1.contiguous(), o2.contiguous(), lse, w1r, lamr,
                        (q1,) * 4, q1, None, key_bias, dq[0], dq[1], dk[0], dk[1], dvv, is_causal, scale, _PLAIN,
                        tiles=tiles)
    return dq, dk, dvv, r


# ------------------------------------------------------------------------- PyTorch operators and autograd
#
# The kernels are registered as two PyTorch operators (torch.library.custom_op) with fake implementations that
# give only the output shapes, so torch.compile and torch.export trace through the kernel as one opaque node each
# (fullgraph=True, no graph break), and AOTAutograd sees the backward as an operator too.


@torch.library.custom_op("diffattn::triton_diff_attn_fwd", mutates_args=())
def _fwd_op(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
            lam: torch.Tensor, w1: torch.Tensor, key_bias: torch.Tensor | None, is_causal: bool, scale: float,
            store_branches: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(O, O1, O2, log2-sum-exps); O1, O2 and the log-sum-exps are empty unless ``store_branches``."""
    return _fwd_impl(q1, k1, q2, k2, v, lam, w1, key_bias, is_causal, scale, store_branches)


@_fwd_op.register_fake
def _fwd_fake(q1, k1, q2, k2, v, lam, w1, key_bias, is_causal, scale, store_branches):
    B, H, Nq, _ = q1.shape
    o = q1.new_empty((B, H, Nq, v.shape[-1]), dtype=v.dtype)
    if not store_branches:
        empty = q1.new_empty(0, dtype=torch.float32)
        return o, empty, empty.clone(), empty.clone()
    return o, torch.empty_like(o), torch.empty_like(o), q1.new_empty((2, B, H, Nq), dtype=torch.float32)


@torch.library.custom_op("diffattn::triton_diff_attn_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor,
            v: torch.Tensor, o1: torch.Tensor, o2: torch.Tensor, lse: torch.Tensor, lam: torch.Tensor,
            w1: torch.Tensor, key_bias: torch.Tensor | None, is_causal: bool,
            scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ stacked (2, B, H, Nq, d), dK stacked (2, B, Hkv, Nk, d), dV, r (2, B, H, Nq) fp32)."""
    return _bwd_impl(do, q1, k1, q2, k2, v, o1, o2, lse, lam, w1, key_bias, is_causal, scale)


@_bwd_op.register_fake
def _bwd_fake(do, q1, k1, q2, k2, v, o1, o2, lse, lam, w1, key_bias, is_causal, scale):
    B, H, Nq, d = q1.shape
    return (q1.new_empty((2, *q1.shape)), k1.new_empty((2, *k1.shape)), v.new_empty(v.shape),
            q1.new_empty((2, B, H, Nq), dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    q1, k1, q2, k2, v, lam, w1, key_bias, is_causal, scale, store_branches = inputs
    _, o1, o2, lse = output
    ctx.save_for_backward(q1, k1, q2, k2, v, o1, o2, lse, lam, w1, key_bias)
    ctx.is_causal, ctx.scale, ctx.store_branches = is_causal, scale, store_branches


def _input_grads(ctx, do, bwd):
    """Gradients of (q1, k1, q2, k2, v, λ, w1) from the saved tensors; ``bwd`` is the backward operator or its
    implementation. ∂L/∂w1 = rowsum(dO ⊙ O1), ∂L/∂λ = −rowsum(dO ⊙ O2), summed to the shapes the weights were
    broadcast from."""
    if not ctx.store_branches:
        raise RuntimeError("triton_diff_attention ran without saving its branch outputs (called with no input "
                           "that requires grad, or under torch.no_grad), so it has no backward")
    q1, k1, q2, k2, v, o1, o2, lse, lam, w1, key_bias = ctx.saved_tensors
    dq, dk, dv, r = bwd(do, q1, k1, q2, k2, v, o1, o2, lse, lam, w1, key_bias, ctx.is_causal, ctx.scale)
    dlam = _sum_to(-r[1].unsqueeze(-1), lam) if ctx.needs_input_grad[5] else None
    dw1 = _sum_to(r[0].unsqueeze(-1), w1) if ctx.needs_input_grad[6] else None
    return dq[0], dk[0], dq[1], dk[1], dv, dlam, dw1


def _backward(ctx, do, _do1, _do2, _dlse):
    return *_input_grads(ctx, do, _bwd_op), None, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _DiffAttnFunction(torch.autograd.Function):
    """The same forward and backward as the operators, for eager mode: an autograd.Function calls the launchers
    directly, without the operator dispatch around them (in eager mode that dispatch cost more host time per
    layer than the kernels took on the GPU at ViT sizes). Under torch.compile the operators are used."""

    @staticmethod
    def forward(ctx, q1, k1, q2, k2, v, lam, w1, key_bias, is_causal, scale, store_branches):
        o, o1, o2, lse = _fwd_impl(q1, k1, q2, k2, v, lam, w1, key_bias, is_causal, scale, store_branches)
        _setup_context(ctx, (q1, k1, q2, k2, v, lam, w1, key_bias, is_causal, scale, store_branches),
                       (o, o1, o2, lse))
        return o

    @staticmethod
    def backward(ctx, do):
        return *_input_grads(ctx, do, _bwd_impl), None, None, None, None


# ------------------------------------------------------------------------------ one differential layer
#
# A differential layer's attention in one autograd node (Ye et al. 2024 §2.1): the interleaved head pairs go to the
# kernels as strided views (no split, no stack), w1 and λ are made inside the kernels from what produces them (the
# reparam vectors, or the gate's or λ projection's logits), the sub-norm × (1 − λ_init) is the forward's epilogue
# and the backward's preprocess, and the output is written in the layer's (B, N, H·dv) layout. A training step of
# the layer then dispatches the ops of a standard layer plus a few allocations (tests/test_layers_ops.py counts
# them).

#: λ forms the kernels compute themselves (:meth:`diffattn.lambdas.LambdaForm.kernel_inputs`), by ``LAM_MODE``
LAMBDA_MODES = {"reparam": 1, "gate": 2, "sigmoid": 3}


def _mode_rows(mode: int, lam_inputs: tuple[torch.Tensor, ...], dummy: torch.Tensor):
    """(w1 rows, λ rows, the four reparam vectors) kernel arguments for a λ mode; unused ones are ``dummy``."""
    if mode == 1:
        return dummy, dummy, lam_inputs
    zt = lam_inputs[0].transpose(1, 2)  # (B, N, H) logits as (B, H, N)
    return zt, zt, (dummy,) * 4


class _DiffLayerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, p0, p1, p2, p3, nw, key_bias, k_paired: bool, ep: _Epilogue, is_causal: bool,
                scale: float, store_branches: bool):
        lam_inputs = (p0, p1, p2, p3) if ep.mode == 1 else (p0,)  # the λ inputs as separate arguments (autograd)
        q1, q2 = q[:, 0::2], q[:, 1::2]  # (B, H, Nq, d) views of the pairs
        k1, k2 = (k[:, 0::2], k[:, 1::2]) if k_paired else (k, k)
        B, H2, Nq, _ = q.shape
        H, dv = H2 // 2, v.shape[-1]
        specs = {"out": ((B, Nq, H, dv), v.dtype, None)}
        if store_branches:
            specs.update(o1=((B, H, Nq, dv), v.dtype, None), o2=((B, H, Nq, dv), v.dtype, None),
                         lse=((2, B, H, Nq), torch.float32, None))
        t = _carve(q.device, specs)
        out = t["out"].transpose(1, 2)  # (B, H, Nq, dv), stored as (B, Nq, H, dv)
        w1r, lamr, lp = _mode_rows(ep.mode, lam_inputs, q)
        branches = (t["o1"], t["o2"], t["lse"]) if store_branches else None
        o1, o2, lse = _fwd_core(q1, k1, q2, k2, v, w1r, lamr, lp, q if nw is None else nw, key_bias, out,
                                is_causal, scale, store_branches, ep, branches=branches)
        if store_branches:
            ctx.save_for_backward(q, k, v, o1, o2, lse, nw, key_bias, *lam_inputs)
        ctx.k_paired, ctx.ep, ctx.is_causal, ctx.scale, ctx.store_branches = k_paired, ep, is_causal, scale, \
            store_branches
        return out

    @staticmethod
    def backward(ctx, dy):
        if not ctx.store_branches:
            raise RuntimeError("the fused differential layer ran without saving its branch outputs (under "
                               "torch.no_grad or with no input that requires grad), so it has no backward")
        q, k, v, o1, o2, lse, nw, key_bias, *lam_inputs = ctx.saved_tensors  # (B, 2H, Nq, d), ...
        ep = ctx.ep
        dy = dy if dy.stride(-1) == 1 else dy.contiguous()
        B, H2, Nq, d = q.shape
        dv_ = v.shape[-1]
        w1r, lamr, lp = _mode_rows(ep.mode, tuple(lam_inputs), q)
        rows, _, nprog, finalize = _preprocess_grid(B, H2 // 2, Nq, dv_, ep)
        specs = {"dq": (q.shape, q.dtype, q), "dk": (k.shape, k.dtype, k), "dv": (v.shape, v.dtype, v),
                 "work": ((_work_size(rows, nprog, dv_, finalize),), torch.float32, None)}
        if _writes_do(dy, ep):
            specs["do"] = ((B, H2 // 2, Nq, dv_), v.dtype, None)
        if ep.mode in (2, 3) and ctx.needs_input_grad[3]:
            specs["dzt"] = (w1r.shape, lam_inputs[0].dtype, w1r)  # (B, H, Nq) in the logits' layout
        if ep.mode == 1:
            specs["dlp"] = ((4, d), lp[0].dtype, None)
        if nw is not None:
            specs["dnw"] = (nw.shape, nw.dtype, None)
        t = _carve(q.device, specs)  # the inputs' layouts for dq, dk, dv
        dq, dk, dv = t["dq"], t["dk"], t["dv"]
        q1, q2 = q[:, 0::2], q[:, 1::2]
        k1, k2 = (k[:, 0::2], k[:, 1::2]) if ctx.k_paired else (k, k)
        dk1, dk2 = (dk[:, 0::2], dk[:, 1::2]) if ctx.k_paired else (dk, dk)
        dzt = t.get("dzt")
        _, dlp, dnw = _bwd_core(dy, q1, k1, q2, k2, v, o1, o2, lse, w1r, lamr, lp, q if nw is None else nw, dzt,
                                key_bias, dq[:, 0::2], dq[:, 1::2], dk1, dk2, dv, ctx.is_causal, ctx.scale, ep,
                                k_shared=not ctx.k_paired, scratch=t)
        if ep.mode == 1:
            dlam = tuple(dlp.unbind(0))  # λ_q1, λ_k1, λ_q2, λ_k2
        else:
            dlam = (None if dzt is None else dzt.transpose(1, 2), None, None, None)  # (B, N, H) as z
        dnw = dnw if ctx.needs_input_grad[7] else None
        return dq, dk, dv, *dlam, dnw, None, None, None, None, None, None


def fused_layer_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, k_paired: bool, lambda_mode: str,
                       lambda_inputs: tuple[torch.Tensor, ...], norm_weight: torch.Tensor | None,
                       norm_width: int | None, attn_mask, is_causal: bool,
                       operator_checked: bool = False) -> str | None:
    """Why :func:`fused_layer_attention` cannot run these inputs, or None when it can. Never raises.
    ``operator_checked``: the caller already had :func:`triton_unsupported_reason` accept the branches (the
    layers do, through ``diff_attention``'s dispatch), so only what the layer path adds is checked."""
    try:
        if q.shape[1] % 2:
            return f"q must hold head pairs (an even head count), got {q.shape[1]} heads"
        if not operator_checked:
            k1, k2 = (k[:, 0::2], k[:, 1::2]) if k_paired else (k, k)
            reason = _check(q[:, 0::2], k1, q[:, 1::2], k2, v, 1.0, 1.0, attn_mask, is_causal, 0.0)
            if reason is not None:
                return reason
        if lambda_mode not in LAMBDA_MODES:
            return f"lambda_mode must be one of {tuple(LAMBDA_MODES)}, got {lambda_mode!r}"
        B, H2, Nq, d = q.shape
        if lambda_mode == "reparam":
            if len(lambda_inputs) != 4 or any(t.shape != (d,) or t.device != q.device for t in lambda_inputs):
                return f"the reparam λ needs four vectors of width d={d} on {q.device} (one λ per layer)"
        elif len(lambda_inputs) != 1 or lambda_inputs[0].shape != (B, Nq, H2 // 2) or \
                lambda_inputs[0].device != q.device:
            return f"the {lambda_mode} λ needs logits of shape (B, N, H) = {(B, Nq, H2 // 2)} on {q.device}"
        if norm_width is not None and norm_width != v.shape[-1]:
            return f"the sub-norm's width {norm_width} is not the value width {v.shape[-1]}"
        if norm_weight is not None and (norm_weight.shape != (v.shape[-1],) or norm_weight.device != q.device):
            return f"the sub-norm weight must have shape ({v.shape[-1]},) on {q.device}"
        return None
    except Exception as e:  # noqa: BLE001 - a reason, never an exception
        return f"could not check the inputs ({type(e).__name__}: {e})"


def fused_layer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, k_paired: bool, lambda_mode: str,
                          lambda_inputs: tuple[torch.Tensor, ...], lambda_init: float = 0.0,
                          norm_width: int | None = None, norm_weight: torch.Tensor | None = None,
                          norm_scale: float = 1.0, norm_eps: float = 1e-5, attn_mask: torch.Tensor | None = None,
                          is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """One differential layer's attention, its λ and its sub-norm in the fused kernels:

        y = s · RMSNorm(w1 ⊙ A1 V − λ ⊙ A2 V) ⊙ w     (Ye et al. 2024 §2.1; without the norm when
                                                        ``norm_width`` is None)

    q (B, 2H, Nq, d) with the two branches' heads interleaved (2i, 2i+1), as a layer projects them; k likewise
    (B, 2Hkv, Nk, d) when ``k_paired``, else one K (B, Hkv, Nk, d) for both (Differential Transformer V2); v (B, Hkv,
    Nk, dv). ``lambda_mode`` "reparam": ``lambda_inputs`` the four vectors (λ_q1, λ_k1, λ_q2, λ_k2) of width d and
    w1 = 1; "gate" (M-DGSA, Lygizou & Kalamaras 2025): the logits z (B, Nq, H), w1 = σ(z), λ = 1 − σ(z); "sigmoid"
    (Ye et al. 2026): the logits z, λ = σ(z). Returns (B, H, Nq, dv), stored as (B, Nq, H, dv) so that the heads
    concatenate without a copy. Inputs :func:`fused_layer_reason` accepts only."""
    mode = LAMBDA_MODES[lambda_mode]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    key_bias = None if attn_mask is None else _mask_as_key_bias(attn_mask, q.shape[0], k.shape[2])
    ep = _Epilogue(mode=mode, lam_init=float(lambda_init), norm=norm_width is not None,
                   affine=norm_weight is not None, norm_scale=float(norm_scale), eps=float(norm_eps))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    lambda_inputs = tuple(lambda_inputs)
    store_branches = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, norm_weight, *lambda_inputs))
    slots = lambda_inputs + (None,) * (4 - len(lambda_inputs))
    return _DiffLayerFunction.apply(q, k, v, *slots, norm_weight, key_bias, k_paired, ep, is_causal, scale,
                                    store_branches)


# ------------------------------------------------------------------------------------------ public API


def triton_unsupported_reason(
    q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p
) -> str | None:
    """Why :func:`triton_diff_attention` cannot run these inputs, or None when it can. Never raises."""
    try:
        return _check(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p)
    except Exception as e:  # noqa: BLE001 - a reason, never an exception
        return f"could not check the inputs ({type(e).__name__}: {e})"


def triton_diff_attention(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor,
    k2: torch.Tensor,
    v: torch.Tensor,
    lambda_: Weight,
    *,
    weight1: Weight = 1.0,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Fused differential attention O = (w1 ⊙ A1 − λ ⊙ A2) V (Ye et al. 2024, eq. 1).

    Args:
        q1, q2: (B, H, Nq, d) queries of the two branches, d in {16, 32, 64, 128}.
        k1, k2: (B, Hkv, Nk, d) keys; H % Hkv == 0 (query head i reads kv head i // (H / Hkv)).
        v: (B, Hkv, Nk, dv) values shared by both branches, dv in {d, 2d}.
        lambda_, weight1: floats or tensors broadcastable to (B, H, Nq, 1) (per layer, per head, or per query
            token and head as in the M-DGSA gate); tensors get gradients.
        attn_mask: None or a key-padding mask broadcastable to (B, H, Nq, Nk) whose H and Nq dims are 1 after
            right-aligned broadcasting, e.g. (B, 1, 1, Nk) or (Nk,): bool (True = attend) or additive float
            (−inf or ≤ finfo.min / 2 blocks a key; other values are added to the scores).
        is_causal: causal mask aligned to the end: query i sees keys j ≤ i + (Nk − Nq).
        scale: s in softmax(Q Kᵀ s); default 1/√d.
        dropout_p: must be 0 (no dropout in the kernel).

    Returns:
        (B, H, Nq, dv) in the dtype of ``v``. A query row whose every key is masked gives exactly 0 (and zero
        gradients).

    Raises:
        ValueError: with :func:`triton_unsupported_reason` when the kernel cannot run these inputs.
    """
    reason = triton_unsupported_reason(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p)
    if reason is not None:
        raise ValueError(f"triton_diff_attention cannot run these inputs: {reason}")
    return run_checked(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale)


def run_checked(q1, k1, q2, k2, v, lambda_: Weight, weight1: Weight, attn_mask, is_causal: bool,
                scale: float | None) -> torch.Tensor:
    """:func:`triton_diff_attention` for inputs that :func:`triton_unsupported_reason` already accepted (the
    ``triton`` backend of :func:`diffattn.functional.diff_attention` checks once, not twice)."""
    scale = 1.0 / math.sqrt(q1.shape[-1]) if scale is None else float(scale)
    key_bias = None if attn_mask is None else _mask_as_key_bias(attn_mask, q1.shape[0], k1.shape[2])
    lam, w1 = _as_tensor(lambda_, q1.device), _as_tensor(weight1, q1.device)
    store_branches = torch.is_grad_enabled() and any(
        t.requires_grad for t in (q1, k1, q2, k2, v, lam, w1))
    if torch.compiler.is_compiling():  # one operator node in the graph (fake implementation for tracing)
        return _fwd_op(q1, k1, q2, k2, v, lam, w1, key_bias, is_causal, scale, store_branches)[0]
    return _DiffAttnFunction.apply(q1, k1, q2, k2, v, lam, w1, key_bias, is_causal, scale, store_branches)
