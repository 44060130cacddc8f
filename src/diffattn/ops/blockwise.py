"""Differential attention in query blocks with its own backward: the ``sdpa`` backend's CPU training path.

    O = (w1 ⊙ A1 − λ ⊙ A2) V,   A_b = softmax(Q_b K_bᵀ s + M)          (Ye et al. 2024, "Differential Transformer",
                                                                          eq. 1; w1 = g, λ = 1 − g for M-DGSA)

A block of queries meets all of its keys at once, so each row of A1 and A2 is complete in memory and the two maps
are combined *before* the product by V: P = w1 ⊙ A1 − λ ⊙ A2, O = P V, one product of width dv instead of one per
branch. Per query–key pair and differential head that is 2·d (two Q Kᵀ) + dv multiply-adds against the 2·(d + dv)
of two fused-attention calls (4·dv with Q and K zero-padded to dv, what PyTorch's CPU flash kernel needs); with
dv = 2d it is the same count as standard attention with twice the heads of width d. The backward recomputes A1 and
A2 per block from the saved unpadded Q and K (the recomputation of FlashAttention, Dao et al. 2022, §3.1, with
whole rows instead of an online softmax) and uses the softmax gradient row by row (Dao 2023, FlashAttention-2,
§3.1, eqs. for dS):

    dP = dO Vᵀ,   g_b = rowsum(dP ⊙ A_b),   dV = Pᵀ dO
    dS1 = w1 ⊙ A1 ⊙ (dP − g1),   dS2 = −λ ⊙ A2 ⊙ (dP − g2),   dQ_b = s · dS_b K_b,   dK_b = s · dS_bᵀ Q_b
    dw1 = rowsum(dO ⊙ A1 V) = g1,   dλ = −rowsum(dO ⊙ A2 V) = −g2      (summed to the shapes w1 and λ had)

Only Q1, K1, Q2, K2 and V are saved (no padded copies, no outputs, no maps); a block holds at most
:data:`BLOCK_ELEMENTS` scores per map, or :data:`MIN_BLOCK_ROWS` query rows of one batch element where those are
more. Dropout is not done here (the caller takes the fused kernels for it).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["blockwise_diff_attention", "BLOCK_ELEMENTS", "MIN_BLOCK_ROWS"]

#: scores per map in one block of queries, batch elements × H × rows × keys (4 MiB in float32; at most a quarter
#: of V's elements), unless :data:`MIN_BLOCK_ROWS` rows of one batch element are more: small enough that the four
#: block-sized temporaries of the backward stay well below the layer's own activations
BLOCK_ELEMENTS = 1 << 20
#: fewest query rows in a block: a product with K of 32 rows runs at a third of the speed of one with 128 (2-core
#: CPU, float32), so a long sequence is cut into batch elements before it is cut into short blocks
MIN_BLOCK_ROWS = 128


def _rows(t: torch.Tensor | float) -> torch.Tensor | float:
    """A weight broadcastable to (B, H, Nq, 1) as a 4-D tensor (or the float itself)."""
    if isinstance(t, torch.Tensor):
        return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
    return t


def _grouped(t: torch.Tensor, hkv: int, groups: int) -> torch.Tensor:
    """(b, H | 1, r, c) → (b, Hkv | 1, groups | 1, r, c): query head i = (i // groups, i % groups)."""
    if t.shape[1] == 1:
        return t.unsqueeze(2)
    return t.unflatten(1, (hkv, groups))


def _block_rows(t: torch.Tensor, hkv: int, groups: int) -> torch.Tensor:
    """(b, H, r, c) → (b, Hkv, groups·r, c), the rows one product with K or V serves."""
    return t if groups == 1 else t.unflatten(1, (hkv, groups)).flatten(2, 3)


def _unblock_rows(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Inverse of :func:`_block_rows`: (b, Hkv, groups·r, c) → (b, H, r, c)."""
    return t if groups == 1 else t.unflatten(2, (groups, -1)).flatten(1, 2)


def _window(m: torch.Tensor, b: slice, i0: int, i1: int, kend: int) -> torch.Tensor:
    """Batch elements b, rows i0:i1 and keys 0:kend of a mask broadcastable to (B, H, Nq, Nk) (size-1 dims stay)."""
    rows = slice(i0, i1) if m.shape[-2] != 1 else slice(None)
    keys = slice(0, kend) if m.shape[-1] != 1 else slice(None)
    return m[b if m.shape[0] != 1 else slice(None), :, rows, keys]


class _Plan:
    """Shapes, masks and block sizes shared by the forward and backward passes."""

    def __init__(self, q1, k1, v, keep, bias, causal, scale):
        self.B, self.H, self.nq, self.d = q1.shape
        self.hkv, self.nk = k1.shape[1], k1.shape[2]
        self.groups = self.H // self.hkv
        self.keep, self.bias, self.causal, self.scale = keep, bias, causal, scale
        budget = min(BLOCK_ELEMENTS, v.numel() // 4)  # and a quarter of V's size, for small layers
        per_row = max(1, self.H * self.nk)  # scores per query row of one batch element
        self.rows = min(self.nq, max(MIN_BLOCK_ROWS, budget // per_row))
        self.batch = max(1, min(self.B, budget // (per_row * self.rows)))
        self.tri = None
        if causal:  # Nq == Nk: inside the diagonal block, key j > query i is blocked
            idx = torch.arange(self.rows, device=q1.device)
            self.tri = idx.unsqueeze(0) > idx.unsqueeze(1)  # (rows, rows), True = blocked

    def blocks(self):
        """(batch slice, first row, end row, end key) of each block."""
        for b0 in range(0, self.B, self.batch):
            b = slice(b0, min(b0 + self.batch, self.B))
            for i0 in range(0, self.nq, self.rows):
                i1 = min(i0 + self.rows, self.nq)
                yield b, i0, i1, (i1 if self.causal else self.nk)

    def scores(self, q, k, b, i0, i1, kend):
        """softmax(Q Kᵀ s + M) for batch elements b, queries i0:i1 and keys 0:kend, (b, Hkv, groups·rows, kend)."""
        qb = _block_rows(q[b, :, i0:i1] * self.scale, self.hkv, self.groups)
        s = torch.matmul(qb, k[b, :, :kend].transpose(-2, -1))
        s5 = s.view(s.shape[0], self.hkv, self.groups, i1 - i0, kend)
        if self.tri is not None:
            s5[..., i0:i1].masked_fill_(self.tri[: i1 - i0, : i1 - i0], float("-inf"))
        if self.bias is not None:
            s5.add_(_grouped(_window(self.bias, b, i0, i1, kend), self.hkv, self.groups))
        if self.keep is not None:
            s5.masked_fill_(~_grouped(_window(self.keep, b, i0, i1, kend), self.hkv, self.groups), float("-inf"))
        return torch.softmax(s, dim=-1)

    def row_weight(self, w, b, i0, i1):
        """A 4-D weight for batch elements b and rows i0:i1 as (b|1, Hkv, groups·rows, 1), or the float itself."""
        if not isinstance(w, torch.Tensor):
            return w
        w = w[b if w.shape[0] != 1 else slice(None), :, slice(i0, i1) if w.shape[2] != 1 else slice(None)]
        w = w.expand(w.shape[0], self.H, i1 - i0, 1)
        return _block_rows(w, self.hkv, self.groups)


def _accumulate(acc: torch.Tensor, kend: int, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc[:, :, :kend] += a @ b (an in-place ``baddbmm_`` on the strided slice is slower: it copies)."""
    acc[:, :, :kend] += torch.matmul(a, b)


def _combine(p1, p2, w1, lam):
    """w1 ⊙ p1 − λ ⊙ p2, in place in p1."""
    if isinstance(w1, torch.Tensor) or w1 != 1.0:
        p1.mul_(w1)
    if isinstance(lam, torch.Tensor):
        return p1.sub_(p2 * lam)
    return p1.add_(p2, alpha=-lam)


class _BlockwiseDiffAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q1, k1, q2, k2, v, lam, w1, plan: _Plan):
        out = v.new_empty(plan.B, plan.H, plan.nq, v.shape[-1])  # (B, H, Nq, dv)
        lam_r, w1_r = _rows(lam), _rows(w1)
        for b, i0, i1, kend in plan.blocks():
            p1 = plan.scores(q1, k1, b, i0, i1, kend)
            p2 = plan.scores(q2, k2, b, i0, i1, kend)
            p = _combine(p1, p2, plan.row_weight(w1_r, b, i0, i1), plan.row_weight(lam_r, b, i0, i1))
            del p2
            out[b, :, i0:i1] = _unblock_rows(torch.matmul(p, v[b, :, :kend]), plan.groups)
        tensors = [q1, k1, q2, k2, v]
        ctx.lam_tensor, ctx.w1_tensor = isinstance(lam, torch.Tensor), isinstance(w1, torch.Tensor)
        ctx.lam = lam if not ctx.lam_tensor else None
        ctx.w1 = w1 if not ctx.w1_tensor else None
        tensors += [lam] if ctx.lam_tensor else []
        tensors += [w1] if ctx.w1_tensor else []
        ctx.save_for_backward(*tensors)
        ctx.plan = plan
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        plan: _Plan = ctx.plan
        saved = list(ctx.saved_tensors)
        q1, k1, q2, k2, v = saved[:5]
        rest = saved[5:]
        lam = rest.pop(0) if ctx.lam_tensor else ctx.lam
        w1 = rest.pop(0) if ctx.w1_tensor else ctx.w1
        lam_r, w1_r = _rows(lam), _rows(w1)
        need = ctx.needs_input_grad
        dq1, dq2 = torch.empty_like(q1), torch.empty_like(q2)  # every row is written by one block
        dk1, dk2, dv = torch.zeros_like(k1), torch.zeros_like(k2), torch.zeros_like(v)
        want_rows = (ctx.lam_tensor and need[5]) or (ctx.w1_tensor and need[6])
        g1_all = q1.new_zeros(plan.B, plan.H, plan.nq, 1) if want_rows else None
        g2_all = q1.new_zeros(plan.B, plan.H, plan.nq, 1) if want_rows else None
        dout = dout.contiguous() if plan.groups > 1 else dout
        for b, i0, i1, kend in plan.blocks():
            w1b, lamb = plan.row_weight(w1_r, b, i0, i1), plan.row_weight(lam_r, b, i0, i1)
            p1 = plan.scores(q1, k1, b, i0, i1, kend)  # (b, Hkv, g·rows, kend)
            p2 = plan.scores(q2, k2, b, i0, i1, kend)
            dob = _block_rows(dout[b, :, i0:i1], plan.hkv, plan.groups)  # (b, Hkv, g·rows, dv)
            vb = v[b, :, :kend]
            p = _combine(p1.clone(), p2, w1b, lamb)
            _accumulate(dv[b], kend, p.transpose(-2, -1), dob)  # dV = Pᵀ dO
            dp = torch.matmul(dob, vb.transpose(-2, -1))  # dP = dO Vᵀ, (b, Hkv, g·rows, kend)
            g1 = torch.mul(p1, dp, out=p).sum(-1, keepdim=True)  # (b, Hkv, g·rows, 1)
            ds1 = p.addcmul_(p1, g1, value=-1.0)  # A1 ⊙ (dP − g1), in P's buffer
            g2 = torch.mul(p2, dp, out=p1).sum(-1, keepdim=True)
            ds2 = p1.addcmul_(p2, g2, value=-1.0)  # A2 ⊙ (dP − g2), in A1's buffer
            del dp, p2
            for ds, q, k, dq, dk, f in ((ds1, q1, k1, dq1, dk1, w1b), (ds2, q2, k2, dq2, dk2, lamb)):
                f = plan.scale * f if ds is ds1 else -plan.scale * f  # s·w1 or −s·λ per row
                qb = _block_rows(q[b, :, i0:i1], plan.hkv, plan.groups) * f
                _accumulate(dk[b], kend, ds.transpose(-2, -1), qb)  # dK += s·dSᵀ Q
                dq[b, :, i0:i1] = _unblock_rows(torch.matmul(ds, k[b, :, :kend]) * f, plan.groups)
            if want_rows:
                g1_all[b, :, i0:i1] = _unblock_rows(g1, plan.groups)
                g2_all[b, :, i0:i1] = _unblock_rows(g2, plan.groups)
        dlam = dw1 = None
        if ctx.lam_tensor and need[5]:
            dlam = (-g2_all).sum_to_size(lam_r.shape).view(lam.shape).to(lam.dtype)
        if ctx.w1_tensor and need[6]:
            dw1 = g1_all.sum_to_size(w1_r.shape).view(w1.shape).to(w1.dtype)
        return dq1, dk1, dq2, dk2, dv, dlam, dw1, None


def blockwise_diff_attention(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor,
                             v: torch.Tensor, lambda_: torch.Tensor | float, weight1: torch.Tensor | float,
                             keep: torch.Tensor | None, bias: torch.Tensor | None, causal: bool,
                             scale: float) -> torch.Tensor:
    """O = (w1 ⊙ A1 − λ ⊙ A2) V by blocks of queries (and of batch elements), with the backward of the module
    docstring.

    q1, q2: (B, H, Nq, d); k1, k2: (B, Hkv, Nk, d); v: (B, Hkv, Nk, dv); λ and w1 floats or tensors
    broadcastable to (B, H, Nq, 1). ``keep`` (bool, True = attend) and ``bias`` (additive, 0 where blocked) are a
    :class:`~diffattn.ops.functional.PreparedMask`'s, broadcastable to (B, H, Nq, Nk), with no row entirely blocked;
    ``causal`` is the end-aligned causal mask for Nq == Nk without other mask (the blocks then stop at the
    diagonal). Returns (B, H, Nq, dv) in the inputs' dtype.
    """
    dtype = q1.dtype
    lambda_, weight1 = (w.to(dtype) if isinstance(w, torch.Tensor) else w for w in (lambda_, weight1))
    plan = _Plan(q1, k1, v, keep, bias, causal, scale)
    return _BlockwiseDiffAttention.apply(q1, k1, q2, k2, v, lambda_, weight1, plan)
