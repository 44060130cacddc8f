"""The differential attention operator and its backends.

    O = (w1 ⊙ A1 − λ ⊙ A2) V,   A_b = softmax(cap(Q_b K_bᵀ · s) + M)

Ye et al. 2024 ("Differential Transformer", eq. 1) with w1 = 1 and one λ per layer; DiffCLIP (Hammoud et al.
2025, §3.1) uses the same form. The M-DGSA gate (Lygizou & Kalamaras 2025, §3) passes w1 = g and λ = 1 − g per token
and head, which is why both weights broadcast to (B, H, Nq, 1): a weight that scales a whole query row commutes with
the product by V, (g ⊙ A) V = g ⊙ (A V), so every O(N) backend serves the gate too. ``cap`` is the identity, or
Gemma-2's logit soft-capping cap(s) = c · tanh(s / c) (Gemma Team 2024, §2).

Backends
- ``math``: materialises A1 and A2 (Q Kᵀ and the softmax in float32, or float64 for float64 inputs); the only one
  that can return the maps or soft-cap the logits.
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``; never builds an N×N tensor of its own. Since
  (w1 A1 − λ A2) V = w1 (A1 V) − λ (A2 V), it runs ordinary attention per branch and subtracts; on the CPU,
  bfloat16/float16 inputs (and CPU autocast) run both calls on float32 copies, so the subtraction is in float32
  and the output is rounded once (:func:`_branches_in_float32`; docs/reliability.md, "Precision"). CPU training
  (gradients, float32/float64, no dropout, ≥ :data:`BLOCKWISE_MIN_KEYS` keys, dv > d) goes through query
  blocks that combine the two maps before the product by V instead (:mod:`diffattn.ops.blockwise`).
- ``triton``: the fused one-pass GPU kernel in :mod:`diffattn.ops.kernels` (CUDA only).
- ``auto``: ``triton`` on CUDA when the kernel applies and is the faster (:func:`_triton_preferred`); on the CPU,
  for a few query rows against more keys (decoding), :func:`decode_diff_attention` (no zero-padding, K and V read
  once); else ``sdpa``; ``math`` when weights or soft-capping are asked for. :func:`choose_backend` says which
  path ``auto`` takes for given inputs, and why.

Masks: bool (True = attend) or additive float, broadcastable to (B, H, Nq, Nk), 0-D to 4-D. A float entry at or
below half the most negative finite value of the mask's own dtype (``torch.finfo(mask.dtype).min``, what Hugging
Face fills padding with) or −inf blocks its key, whatever the dtype the computation runs in. Every path converts the
mask through :func:`prepare_mask`. A query row whose every key is blocked gives exactly 0.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import blockwise as _blockwise
from .dispatch import DispatchEntry, device_name, triton_rule
from .masks import blocked as _blocked

__all__ = [
    "diff_attention",
    "attention",
    "causal_mask",
    "sliding_window_mask",
    "restrict_mask",
    "prepare_mask",
    "PreparedMask",
    "AttentionWeights",
    "BACKENDS",
    "decode_diff_attention",
    "DECODE_MAX_QUERIES",
    "choose_backend",
    "BackendChoice",
    "diff_attention_pairs",
    "compute_dtype",
    "upcast",
    "takes_triton",
    "SCORE_HOOK",
]

BACKENDS = ("auto", "math", "sdpa", "triton")

Weight = float | torch.Tensor


class AttentionWeights(NamedTuple):
    """Maps returned by ``return_weights=True``: each (B, H, Nq, Nk)."""

    first: torch.Tensor  # A1
    second: torch.Tensor  # A2
    combined: torch.Tensor  # w1 ⊙ A1 − λ ⊙ A2


# --------------------------------------------------------------------------------------------- validation


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_broadcast(name: str, t: torch.Tensor, target: tuple[int, ...], what: str) -> None:
    if t.dim() > len(target):
        raise ValueError(f"{name} must have at most {len(target)} dims broadcastable to {what} {target}, "
                         f"got shape {tuple(t.shape)}")
    for got, want in zip(reversed(t.shape), reversed(target)):
        if got != 1 and got != want:
            raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to {what} {target}; "
                             f"each dim must be 1 or match (right-aligned)")


def _check_weight(name: str, w, shape: tuple[int, ...], device: torch.device) -> Weight | None:
    """A float or a floating tensor broadcastable to ``shape``; Python and NumPy scalars become ``float``."""
    if w is None:
        return None
    if _is_real(w):
        w = float(w)
        if not math.isfinite(w):
            raise ValueError(f"{name} must be finite, got {w}")
        return w
    if not isinstance(w, torch.Tensor):
        raise ValueError(f"{name} must be a float or a floating tensor, got {type(w).__name__}")
    if not w.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {w.dtype}")
    if w.device != device:
        raise ValueError(f"{name} is on {w.device} but the inputs are on {device}")
    _check_broadcast(name, w, shape, "(B, H, Nq, 1)")
    return w


def _check_mask(attn_mask, target: tuple[int, ...], device: torch.device) -> None:
    if attn_mask is None:
        return
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise ValueError(f"attn_mask must be bool (True = attend) or an additive float mask, "
                        f"got dtype {attn_mask.dtype}")
    if attn_mask.device != device:
        raise ValueError(f"attn_mask is on {attn_mask.device} but the inputs are on {device}")
    _check_broadcast("attn_mask", attn_mask, target, "(B, H, Nq, Nk)")


def _check_options(is_causal, scale, dropout_p, softcap, backend) -> None:
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is not None and not (_is_real(scale) and math.isfinite(scale)):
        raise ValueError(f"scale must be None or a finite float, got {scale!r}")
    if not _is_real(dropout_p) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if softcap is not None and not (_is_real(softcap) and math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap must be None or a finite float > 0, got {softcap!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


#: the 8-bit float dtypes of this PyTorch build, which the operator refuses (:func:`_validate`)
_FLOAT8 = frozenset(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                                                "float8_e8m0fnu") if hasattr(torch, n))


def _validate(q1, k1, q2, k2, v, names=("q1", "k1", "q2", "k2")) -> None:
    """Shapes, dtypes and devices of the query/key/value tensors."""
    n_q1, n_k1, n_q2, n_k2 = names
    for name, t in ((n_q1, q1), (n_k1, k1), (n_q2, q2), (n_k2, k2), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a 4-D tensor (B, heads, N, width), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, heads, N, width), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floating point, got dtype {t.dtype}")
        if t.dtype in _FLOAT8:
            raise ValueError(f"{name} has dtype {t.dtype}: 8-bit float inputs are refused (differential attention "
                             f"subtracts two attention outputs that can agree to many digits, and 8-bit floats "
                             f"carry two or three; docs/reliability.md, 'Precision'); pass float32, bfloat16 or "
                             f"float16")
    if q1.shape != q2.shape:
        raise ValueError(f"{n_q1} and {n_q2} must have the same shape (B, H, Nq, d), got {tuple(q1.shape)} and "
                         f"{tuple(q2.shape)}")
    if k1.shape != k2.shape:
        raise ValueError(f"{n_k1} and {n_k2} must have the same shape (B, Hkv, Nk, d), got {tuple(k1.shape)} and "
                         f"{tuple(k2.shape)}")
    B, H, Nq, d = q1.shape
    Bk, Hkv, Nk, dk = k1.shape
    if Bk != B or dk != d:
        raise ValueError(f"{n_k1} of shape {tuple(k1.shape)} must match {n_q1} {tuple(q1.shape)} in batch and width")
    if d == 0:
        raise ValueError(f"{n_q1} must have a head width d >= 1, got shape {tuple(q1.shape)}")
    if H == 0 or Hkv == 0:
        raise ValueError(f"{n_q1} and {n_k1} need at least one head, got H={H} ({n_q1} {tuple(q1.shape)}) and "
                         f"Hkv={Hkv} ({n_k1} {tuple(k1.shape)})")
    if v.shape[:3] != (B, Hkv, Nk):
        raise ValueError(f"v must have shape (B, Hkv, Nk, dv) = ({B}, {Hkv}, {Nk}, dv), got {tuple(v.shape)}")
    if H % Hkv != 0:
        raise ValueError(f"the query head count H={H} must be divisible by the key/value head count Hkv={Hkv}")
    dtypes = {t.dtype for t in (q1, k1, q2, k2, v)}
    if len(dtypes) != 1:
        raise ValueError(f"the query, key and value tensors must share one dtype, got {sorted(map(str, dtypes))}")
    devices = {t.device for t in (q1, k1, q2, k2, v)}
    if len(devices) != 1:
        raise ValueError(f"the query, key and value tensors must be on one device, got {sorted(map(str, devices))}")


# ------------------------------------------------------------------------------------------------ masks


def causal_mask(nq: int, nk: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool (Nq, Nk) causal mask aligned to the end: query i sees keys j ≤ i + (Nk − Nq).

    With a KV cache the Nq new queries are the last Nq positions of the Nk keys.
    """
    i = torch.arange(nq, device=device).unsqueeze(1)
    j = torch.arange(nk, device=device).unsqueeze(0)
    return j <= i + (nk - nq)


def sliding_window_mask(nq: int, nk: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool (Nq, Nk) causal sliding-window mask aligned to the end (True = may attend).

    Query i sits at key position p_i = i + Nk − Nq and sees key j iff 0 ≤ p_i − j < ``window``: itself and the
    ``window`` − 1 keys before it (Mistral, Jiang et al. 2023 §2; Gemma-2's local layers, Gemma Team 2024 §2).
    """
    for name, value, low in (("nq", nq, 0), ("nk", nk, 0), ("window", window, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    i = torch.arange(nq, device=device).unsqueeze(1) + (nk - nq)  # (Nq, 1) key positions of the queries
    j = torch.arange(nk, device=device).unsqueeze(0)  # (1, Nk)
    dist = i - j
    return (dist >= 0) & (dist < window)


def restrict_mask(mask: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor:
    """``mask`` (bool, True = attend, or additive float; or None) further limited to where bool ``keep`` is True."""
    if mask is None:
        return keep
    if mask.dtype == torch.bool:
        return mask & keep
    return torch.where(keep, mask, torch.finfo(mask.dtype).min)  # broadcasts both ways


class PreparedMask(NamedTuple):
    """A mask in the form every backend takes (see :func:`prepare_mask`)."""

    keep: torch.Tensor | None  # bool (1|B, 1|H, Nq, Nk), True = attend; no row is all False
    bias: torch.Tensor | None  # additive (1|B, 1|H, Nq, Nk) in the requested dtype, 0 where blocked; None if bool
    row_ok: torch.Tensor | None  # bool (…, Nq, 1), False where the caller's row was fully masked; None if none can be
    sdpa_causal: bool  # the causal mask was left to the kernel (no other mask, Nq == Nk)

    def additive(self) -> torch.Tensor | None:
        """``bias`` with −inf where blocked (or the bool ``keep`` when there is no bias): what SDPA takes."""
        if self.bias is None:
            return self.keep
        return self.bias.masked_fill(~self.keep, float("-inf"))

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """scores + M with blocked entries at −inf (every row keeps at least one finite entry)."""
        if self.keep is None:
            return scores
        if self.bias is not None:
            scores = scores + self.bias.to(scores.dtype)
        return scores.masked_fill(~self.keep, float("-inf"))


def prepare_mask(attn_mask: torch.Tensor | None, *, is_causal: bool, nq: int, nk: int, dtype: torch.dtype,
                 device: torch.device, scale: float = 1.0) -> PreparedMask:
    """The one conversion of a caller's mask, used by every backend and by the maps.

    - 0-D to 3-D masks are viewed as 4-D (right-aligned, as in broadcasting).
    - The causal mask (end-aligned) is merged in; SDPA keeps it as its own flag when there is no other mask,
      Nq == Nk and ``scale`` > 0 (its causal kernels give NaN for scale ≤ 0).
    - Which entries are blocked is decided in the mask's own dtype (bool False, −inf, ≤ finfo.min / 2), then the
      finite entries are cast to ``dtype``, clamped to its finite range: a float64 ``finfo.min`` padding mask
      never becomes −inf (nor NaN) in float32, and a float32 mask never meets float64 inputs unconverted.
    - Rows the caller blocked entirely are opened (so every kernel stays finite) and reported in ``row_ok``;
      the operator sets their output to exactly 0.
    """
    if attn_mask is None and is_causal and nq == nk and scale > 0:
        return PreparedMask(None, None, None, True)
    keep = bias = None
    if attn_mask is not None:
        m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        if m.dtype == torch.bool:
            keep = m
        else:
            keep = ~_blocked(m)
            info = torch.finfo(dtype)
            bias = torch.where(keep, m, torch.zeros((), dtype=m.dtype, device=m.device))
            if torch.finfo(m.dtype).max > info.max:
                bias = bias.clamp(info.min, info.max)
            bias = bias.to(dtype)
    if is_causal:
        c = causal_mask(nq, nk, device)
        keep = c if keep is None else keep & c
    if keep is None:
        return PreparedMask(None, None, None, False)
    row_ok = keep.any(dim=-1, keepdim=True)  # (..., Nq, 1)
    keep = keep | ~row_ok
    if keep.dim() < 4:
        keep = keep.reshape((1,) * (4 - keep.dim()) + tuple(keep.shape))
        row_ok = row_ok.reshape(keep.shape[:-1] + (1,))
    return PreparedMask(keep, bias, row_ok, False)


# -------------------------------------------------------------------------------------------- helpers


def _combine(o1, o2, weight1, lambda_):
    """w1 ⊙ o1 − λ ⊙ o2 in as few ops as the weights allow (one ``addcmul`` for w1 = 1 and a tensor λ)."""
    out = o1 * weight1 if not (isinstance(weight1, float) and weight1 == 1.0) else o1
    if isinstance(lambda_, torch.Tensor) and lambda_.dim() <= out.dim() and torch.broadcast_shapes(
            lambda_.shape, o2.shape) == o2.shape:
        return torch.addcmul(out, o2, lambda_, value=-1)  # the dtype o1 − o2 ⊙ λ promotes to, one rounding
    return out - o2 * lambda_


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 (``torch.promote_types(dtype, float32)`` for the real dtypes, without the
    dispatcher call that ``torch.promote_types`` costs on every forward)."""
    return dtype if dtype in _WIDE_ENOUGH else torch.float32


_WIDE_ENOUGH = (torch.float32, torch.float64)


def upcast(t: torch.Tensor) -> torch.Tensor:
    """To float32, or float64 when the input already is (no op when it already is one of them)."""
    return t if t.dtype in _WIDE_ENOUGH else t.to(torch.float32)


def _expand_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


# --------------------------------------------------------------------------------------------- backends


#: The hook on the logits of the ``math`` path: ``hook(scores, mask) -> scores`` is called by :func:`_probs` with
#: the scaled (soft-capped) logits (B, H, Nq, Nk) of each map and the :class:`PreparedMask`, before the mask and
#: the softmax, and returns the logits to use. None (the default) leaves the path as it is;
#: :mod:`diffattn.diagnostics.logits` sets it (``SCORE_HOOK.set`` / ``reset``) around one layer's call, with that
#: layer routed to ``math``.
SCORE_HOOK: ContextVar[Callable[[torch.Tensor, PreparedMask], torch.Tensor] | None] = ContextVar(
    "diffattn_score_hook", default=None)


def _probs(q, k, mask: PreparedMask, scale, softcap, dropout_p):
    """softmax(cap(Q Kᵀ s) + M) with Q Kᵀ and the softmax in ≥ float32, (B, H, Nq, Nk); fully masked rows are 0."""
    s = torch.matmul(upcast(q), upcast(k).transpose(-2, -1)) * scale  # (B, H, Nq, Nk)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    hook = SCORE_HOOK.get()
    if hook is not None:
        s = hook(s, mask)
    if mask.sdpa_causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    s = mask.apply(s)
    p = torch.softmax(s, dim=-1)
    if mask.row_ok is not None:
        p = p * mask.row_ok
    return F.dropout(p, p=dropout_p, training=True) if dropout_p > 0.0 else p


def _math(q1, k1, q2, k2, v, lambda_, weight1, mask, scale, softcap, dropout_p):
    groups = int(q1.shape[1]) // int(k1.shape[1])  # a Python int, also under torch.jit.trace
    k1, k2, v = (_expand_kv(t, groups) for t in (k1, k2, v))
    a1 = _probs(q1, k1, mask, scale, softcap, dropout_p)
    a2 = _probs(q2, k2, mask, scale, softcap, dropout_p)
    w1 = upcast(weight1) if isinstance(weight1, torch.Tensor) else weight1
    lam = upcast(lambda_) if isinstance(lambda_, torch.Tensor) else lambda_
    a = _combine(a1, a2, w1, lam)  # (B, H, Nq, Nk)
    out = torch.matmul(a.to(v.dtype), v)
    return out, AttentionWeights(a1, a2, a)


def _split_pairs(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Heads (2i, 2i+1) of t (B, 2H, N, w) as two (B, H, N, w) views. Split in the (B, N, 2H, w) layout of the
    projections' views, so that the backward joins the two gradients in one ``stack`` written in that layout (and
    the heads reach the projection without a copy)."""
    a, b = t.transpose(1, 2).unflatten(2, (-1, 2)).unbind(3)  # each (B, N, H, w)
    return a.transpose(1, 2), b.transpose(1, 2)


def _sdpa(q1, k1, q2, k2, v, lambda_, weight1, mask, scale, dropout_p, pairs=None, blockwise: bool | None = None):
    """One call of PyTorch's fused attention per branch, then O = w1 ⊙ (A1 V) − λ ⊙ (A2 V).

    Fused kernels (the CPU flash kernel, CUDA FlashAttention-2) need q/k and v of one width, and v is 2d wide.
    Q and K are zero-padded to width dv (Q Kᵀ is unchanged; the scale is passed explicitly) and both calls read the
    same V, which autograd then saves once. GQA goes to the kernel (``enable_gqa``), so K and V are never
    repeated. Measured on a 2-core CPU (docs/benchmarks.md): four calls on width-d halves of V compute each
    softmax twice and are slower; stacking the branches into one call needs a second copy of V, 2.1× the peak
    memory of standard attention against 1.65× here.

    ``pairs`` = (q, k, k_paired): the tensors q1/q2 (and k1/k2 when ``k_paired``, else k1 = k2 = k) are the
    interleaved head pairs of, as :func:`diff_attention_pairs` passes them; each is then padded once, not per
    branch. ``blockwise``: whether to train through query blocks, when ``auto`` already decided it (None: decide
    here, :func:`_blockwise_preferred`).
    """
    if _blockwise_preferred(q1, k1, q2, k2, v, lambda_, weight1, dropout_p) if blockwise is None else blockwise:
        out = _blockwise.blockwise_diff_attention(q1, k1, q2, k2, v, lambda_, weight1, mask.keep, mask.bias,
                                        mask.sdpa_causal, scale)
        return out, None
    # Python ints, also under torch.jit.trace (where shapes are traced tensors): the head counts and widths fix the
    # structure of the computation, and enable_gqa must be a bool
    H, d = int(q1.shape[1]), int(q1.shape[3])
    Hkv, dv = int(k1.shape[1]), int(v.shape[-1])
    width = max(d, dv)
    if H != Hkv and torch.onnx.is_in_onnx_export():  # the TorchScript ONNX exporter has no SDPA with enable_gqa
        k1, k2, v = (_expand_kv(t, H // Hkv) for t in (k1, k2, v))
        Hkv, pairs = H, None

    def padded(t: torch.Tensor) -> torch.Tensor:
        """(B, h, N, w) -> (B, h, N, width) in one op, laid out as (B, N, h, width) like the projections' views
        (the kernels then write their outputs in that layout and the heads concatenate without a copy)."""
        return t if t.shape[-1] == width else F.pad(t.transpose(1, 2), (0, width - t.shape[-1])).transpose(1, 2)

    if pairs is not None and width != d:
        q, k, k_paired = pairs

        q1, q2 = _split_pairs(padded(q))  # padded once, in the (B, N, 2H, ·) layout (see padded)
        k1, k2 = _split_pairs(padded(k)) if k_paired else (padded(k),) * 2
    elif k1 is k2:  # one K for both branches (Diff Transformer V2, DAA): padded once
        k1 = k2 = padded(k1)
    vv = padded(v)  # (B, Hkv, Nk, width)
    m = mask.additive()
    o1, o2 = (
        F.scaled_dot_product_attention(padded(q), padded(k), vv, attn_mask=m, dropout_p=dropout_p,
                                       is_causal=mask.sdpa_causal, scale=scale, enable_gqa=H != Hkv)[..., :dv]
        for q, k in ((q1, k1), (q2, k2))
    )  # each (B, H, Nq, dv)
    return _combine(o1, o2, weight1, lambda_), None


def _branches_in_float32(q: torch.Tensor) -> bool:
    """Whether the ``sdpa`` backend runs its two calls on float32 copies of the inputs: on the CPU for bfloat16 and
    float16 inputs, and under CPU autocast (which would run them in its lower precision). Each call's output is
    then rounded once to float32 instead of to 8 or 11 significant bits, so w1 ⊙ (A1 V) − λ ⊙ (A2 V) keeps the
    digits in which the two outputs differ; rounding A1 V and A2 V to half precision first costs up to
    u_half · (|w1 ⊙ A1 V| + |λ ⊙ A2 V|), which exceeds the difference itself when the maps are alike and λ ≈ w1
    (Higham 2002, "Accuracy and Stability of Numerical Algorithms", §1.7 on cancellation;
    ``benchmarks/precision.py``). On CUDA the fused kernels keep the inputs' precision (the Triton kernel
    accumulates both maps in float32 itself)."""
    return q.device.type == "cpu" and (q.dtype not in _WIDE_ENOUGH or torch.is_autocast_enabled("cpu"))


def _widened(q1, k1, q2, k2, v, pairs):
    """(q1, k1, q2, k2, v, pairs) of :func:`_sdpa` in float32 (float64 stays): one copy per distinct tensor, so a K
    shared by both branches stays one tensor and interleaved head pairs stay views of one copy."""
    if pairs is not None:
        q, k, k_paired = pairs
        q, k = upcast(q), upcast(k)
        q1, q2 = _split_pairs(q)
        k1, k2 = _split_pairs(k) if k_paired else (k, k)
        return q1, k1, q2, k2, upcast(v), (q, k, k_paired)
    shared = k1 is k2
    k1 = upcast(k1)
    return upcast(q1), k1, upcast(q2), k1 if shared else upcast(k2), upcast(v), None


#: the ``sdpa`` backend trains on the CPU through query blocks from this many keys on (see _blockwise_preferred)
BLOCKWISE_MIN_KEYS = 512


def _blockwise_preferred(q1, k1, q2, k2, v, lambda_, weight1, dropout_p) -> bool:
    """Whether ``sdpa`` trains through :mod:`diffattn.ops.blockwise` instead of two padded fused calls.

    CPU training in float32/float64 without dropout: A1 and A2 are combined before the product by V, so the
    attention core costs what standard attention with 2H heads of width d costs, and the backward keeps the
    unpadded Q and K only. Timed on a 2-core CPU (docs/benchmarks.md, "Training one layer": width 512, B·N =
    8192, causal): the padded calls' time ÷ this path's is 1.2 at N = 512 and more from N = 1024 on; at N = 256
    the two were within the noise, and the per-block Python work grows as N shrinks, so fewer than
    :data:`BLOCKWISE_MIN_KEYS` keys keep the fused kernels. So does a value no wider than the queries (the
    V2 layer's dv = d: nothing is padded there and this path was not measured faster). Inference (no gradient)
    keeps them too, as do dropout, half precision, tracing, export and ``torch.compile``."""
    if q1.device.type != "cpu" or dropout_p > 0.0 or q1.dtype not in (torch.float32, torch.float64):
        return False
    if int(k1.shape[2]) < BLOCKWISE_MIN_KEYS or int(v.shape[-1]) <= int(q1.shape[-1]):
        return False
    if not torch.is_grad_enabled() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return False
    if torch.compiler.is_compiling():
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q1, k1, q2, k2, v, lambda_, weight1))


def _triton(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p):
    """The fused kernel on inputs :func:`_triton_reason` accepted (``dropout_p`` is 0 then)."""
    from .kernels.triton_diff import run_checked

    return run_checked(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale)


def _triton_reason(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p) -> str | None:
    """Why the fused kernel cannot take these inputs, or None when it can."""
    if q1.device.type != "cuda":
        return f"the triton backend needs CUDA tensors, got device {q1.device.type}"
    try:
        from .kernels import triton_unsupported_reason
    except ImportError as e:  # pragma: no cover - triton missing
        return f"triton is not importable ({e})"
    return triton_unsupported_reason(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p)


def takes_triton(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
                 attn_mask: torch.Tensor | None, is_causal: bool, dropout_p: float, backend: str,
                 scale: float) -> bool:
    """Whether :func:`diff_attention` would run these inputs on the fused kernel: ``backend="triton"`` where the
    kernel accepts them (otherwise :func:`diff_attention` raises, naming the reason), or ``"auto"`` where
    :func:`choose_backend` picks it. The layers ask before handing their λ and sub-norm to the kernel as well."""
    if backend == "triton":
        return _triton_reason(q1, k1, q2, k2, v, 1.0, 1.0, attn_mask, is_causal, dropout_p) is None
    if backend == "auto":
        return _auto_backend(q1, k1, q2, k2, v, 1.0, 1.0, attn_mask, is_causal, scale, dropout_p, None,
                             False).backend == "triton"
    return False


#: ``auto``'s rule for a value width the dispatch table does not name: the fused kernel up to this width
TRITON_MAX_UNMEASURED_DV = 128


def _triton_preferred(q: torch.Tensor, dv: int, nk: int) -> DispatchEntry | None:
    """Whether ``auto`` takes the fused kernel where it applies (CUDA): the measured dispatch table
    (:mod:`diffattn.ops.dispatch`, ``dispatch.json``) gives, per card, dtype and value width, the key count below which
    the kernel is the faster. On the NVIDIA H200 (bf16, forward+backward, N = 197 and 512 to 16384): at dv = 128 the
    kernel is as fast as the ``sdpa`` backend or faster up to 8192 keys and 4 % slower at 16384 (non-causal), with
    0.46× its peak memory; at dv = 256 (d = 128) it is faster below 2048 keys only, after which SDPA's
    FlashAttention at width 256 beats the kernel's two fp32 accumulators of width 256. Returns the deciding entry
    when the kernel is preferred, else None (for a width the table lacks: preferred up to
    :data:`TRITON_MAX_UNMEASURED_DV`, with a synthetic entry saying so)."""
    entry = triton_rule(q.device, q.dtype, dv)
    if entry is None:
        return None if dv > TRITON_MAX_UNMEASURED_DV else _unmeasured(str(q.dtype).removeprefix("torch."), dv)
    return entry if entry.prefers_triton(nk) else None


@functools.cache
def _unmeasured(dtype: str, dv: int) -> DispatchEntry:
    """The entry standing for a value width the table lacks (the kernel at every length)."""
    return DispatchEntry("any", dtype, dv, None, f"no measurement for value width {dv}: the kernel up to width "
                                                 f"{TRITON_MAX_UNMEASURED_DV}, as on the measured cards")


def _triton_rule_text(q: torch.Tensor, dv: int) -> str:
    entry = triton_rule(q.device, q.dtype, dv)
    if entry is None:
        return (f"no measurement for value width {dv}: the fused kernel up to width {TRITON_MAX_UNMEASURED_DV}, as "
                f"on the measured cards")
    own = "" if entry.device == device_name(q.device) else f" (no entry for this card: {entry.device}'s)"
    limit = "at every length" if entry.triton_below_keys is None else f"below {entry.triton_below_keys} keys"
    return f"dispatch table{own}: the fused kernel {limit} at value width {dv} ({entry.measured})"


#: ``auto`` takes :func:`decode_diff_attention` for at most this many query rows (CPU)
DECODE_MAX_QUERIES = 16


def _decode_preferred(nq: int, nk: int) -> bool:
    """Whether ``auto`` runs :func:`decode_diff_attention` on the CPU: for a few query rows against more keys
    (decoding with a KV cache) it reads each cached key and value once at its own width, where the ``sdpa`` backend
    copies the keys into a zero-padded buffer and reads V twice (measured 6–8× faster per call at 256 to 8192 cached
    keys, one thread). A short sequence attending to itself (Nq = Nk) keeps the ``sdpa`` path."""
    return nq <= DECODE_MAX_QUERIES and nq < nk


def _grouped_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Q Kᵀ · s for q (B, H, Nq, d) and k (B, Hkv, Nk, d), H = G·Hkv, without repeating K: (B, H, Nq, Nk), formed
    in at least float32 from bfloat16/float16 inputs (as :func:`_probs` forms them), so that two maps that differ
    by less than the half-precision rounding of their logits keep their difference. Query head h reads key head
    h // G (the layout of ``repeat_interleave``)."""
    B, H, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = H // hkv
    s = torch.matmul(upcast(q).reshape(B, hkv, g * nq, d), upcast(k).transpose(-2, -1))  # (B, Hkv, G·Nq, Nk)
    return s.view(B, H, nq, nk) * scale


def decode_diff_attention(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
                          lambda_: Weight, *, weight1: Weight = 1.0, attn_mask: torch.Tensor | None = None,
                          is_causal: bool = False, scale: float) -> torch.Tensor:
    """(w1 ⊙ A1 − λ ⊙ A2) V for a few query rows (decoding), without zero-padding (Ye et al. 2024, eq. 1):

        O = (w1 ⊙ softmax(Q1 K1ᵀ s + M) − λ ⊙ softmax(Q2 K2ᵀ s + M)) V

    The two (B, H, Nq, Nk) maps are built and combined first, then multiplied by V once, so K1, K2 and V are each
    read once at their own width (d, d, dv): the bytes a standard layer of the same size reads, where the ``sdpa``
    backend copies the keys into a zero-padded buffer of width dv and reads V twice. The G = H / Hkv query heads of a
    key/value head share one matmul (keys and values are never repeated), and a K shared by both branches (Diff
    Transformer V2, Ye et al. 2026; DAA) is read once for the two stacked queries. The work is O(Nq · Nk) per head:
    :func:`diff_attention` (``auto``) calls it on the CPU for at most :data:`DECODE_MAX_QUERIES` query rows against
    more keys (a KV cache).

    Shapes as :func:`diff_attention`, which validates the arguments before calling it:
    q1, q2 (B, H, Nq, d); k1, k2 (B, Hkv, Nk, d); v (B, Hkv, Nk, dv); λ and w1 floats or tensors broadcastable
    to (B, H, Nq, 1); ``attn_mask`` bool (True = attend) or additive float; ``is_causal`` aligned to the end.
    Scores and softmax run in at least float32 (float64 stays float64); a row whose every key is masked gives 0.
    Returns (B, H, Nq, dv) in v's dtype.
    """
    B, H, nq, _ = q1.shape
    hkv, nk, dv = k1.shape[1], k1.shape[2], v.shape[-1]
    # one query row at the end of a causal sequence sees every key: no mask to build
    mask = prepare_mask(attn_mask, is_causal=is_causal and nq > 1, nq=nq, nk=nk,
                        dtype=compute_dtype(q1.dtype), device=q1.device, scale=0.0)
    if k1 is k2:  # one K for both branches (Diff Transformer V2): stack the queries, read K once
        s = _grouped_scores(torch.cat([q1, q2], dim=2), k1, scale)  # (B, H, 2·Nq, Nk)
        s1, s2 = s[:, :, :nq], s[:, :, nq:]
    else:
        s1, s2 = _grouped_scores(q1, k1, scale), _grouped_scores(q2, k2, scale)  # each (B, H, Nq, Nk)
    p1 = torch.softmax(mask.apply(s1), dim=-1)
    p2 = torch.softmax(mask.apply(s2), dim=-1)
    cd = p1.dtype
    w1 = weight1.to(cd) if isinstance(weight1, torch.Tensor) else weight1
    lam = lambda_.to(cd) if isinstance(lambda_, torch.Tensor) else lambda_
    a = (p1 if isinstance(w1, float) and w1 == 1.0 else w1 * p1) - lam * p2  # (B, H, Nq, Nk)
    if mask.row_ok is not None:
        a = a * mask.row_ok
    a = a.to(v.dtype).reshape(B, hkv, (H // hkv) * nq, nk)  # (B, Hkv, G·Nq, Nk)
    return torch.matmul(a, v).view(B, H, nq, dv)  # V read once


def _empty(q: torch.Tensor, v: torch.Tensor, nk: int) -> bool:
    return q.shape[0] == 0 or q.shape[2] == 0 or nk == 0 or v.shape[-1] == 0


# ---------------------------------------------------------------------------------------------- operator


def diff_attention(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor,
    k2: torch.Tensor,
    v: torch.Tensor,
    lambda_: Weight,
    *,
    weight1: Weight | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    softcap: float | None = None,
    backend: str = "auto",
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, AttentionWeights]:
    """Differential attention O = (w1 ⊙ A1 − λ ⊙ A2) V (Ye et al. 2024, eq. 1; the M-DGSA gate of Lygizou &
    Kalamaras 2025, eq. 3, passes w1 = g, λ = 1 − g).

    Args:
        q1: (B, H, Nq, d) queries of branch 1.
        k1: (B, Hkv, Nk, d) keys of branch 1; H must be divisible by Hkv (grouped-query attention: query head i
            reads key/value head i // (H / Hkv)).
        q2: (B, H, Nq, d) queries of branch 2.
        k2: (B, Hkv, Nk, d) keys of branch 2.
        v: (B, Hkv, Nk, dv) values, shared by both branches (dv = 2d in Ye et al.'s layout).
        lambda_: λ, a float or a tensor broadcastable to (B, H, Nq, 1): per layer, per head or per token and head.
        weight1: w1 on A1, same shapes as λ; default 1.
        attn_mask: bool (True = attend) or additive float mask broadcastable to (B, H, Nq, Nk); see the module
            docstring for how float masks of any dtype are read.
        is_causal: causal mask aligned to the end (query i sees keys ≤ i + Nk − Nq), combined with attn_mask.
        scale: s in softmax(Q Kᵀ s); default 1/√d.
        dropout_p: dropout on each attention map (independently), applied only when > 0.
        softcap: c of Gemma-2's logit soft-capping, scores ← c · tanh(scores / c) before the mask (Gemma Team
            2024, §2); only the ``math`` backend computes it (``auto`` picks it).
        backend: "auto", "math", "sdpa" or "triton" (see the module docstring).
        return_weights: also return :class:`AttentionWeights` (A1, A2, combined); needs the ``math`` backend.

    Returns:
        (B, H, Nq, dv) output in the dtype of ``v``, and the maps when ``return_weights``. A query row whose every
        key is masked gives exactly 0.
    """
    return _diff_attention(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p, softcap,
                           backend, return_weights, None)


def _diff_attention(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p, softcap, backend,
                    return_weights, pairs):
    """:func:`diff_attention`'s body; ``pairs`` = (q, k, k_paired) when the branches' heads came interleaved in
    one tensor (:func:`diff_attention_pairs`), else None."""
    _validate(q1, k1, q2, k2, v)
    _check_options(is_causal, scale, dropout_p, softcap, backend)
    B, H, nq, d = q1.shape
    nk = k1.shape[2]
    lambda_ = _check_weight("lambda_", lambda_, (B, H, nq, 1), q1.device)
    if lambda_ is None:
        raise ValueError("lambda_ must be a float or a floating tensor, got None")
    weight1 = _check_weight("weight1", weight1, (B, H, nq, 1), q1.device)
    weight1 = 1.0 if weight1 is None else weight1
    _check_mask(attn_mask, (B, H, nq, nk), q1.device)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if return_weights and backend not in ("auto", "math"):
        raise ValueError(f"return_weights=True needs backend 'math' or 'auto', got backend={backend!r}")
    if softcap is not None and backend not in ("auto", "math"):
        raise ValueError(f"softcap={softcap} needs backend 'math' or 'auto' (the sdpa and triton kernels do not "
                         f"soft-cap logits), got backend={backend!r}")

    if backend == "triton":
        reason = _triton_reason(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p)
        if reason is not None:
            raise ValueError(f"backend='triton' cannot run these inputs: {reason}")
        return _triton(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p)
    blockwise = None  # _sdpa decides
    if backend == "auto":
        backend = _auto_backend(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p,
                                softcap, return_weights).backend
        if backend == "triton":
            return _triton(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p)
        if backend == "decode":  # decoding: no zero-padding, K and V read once
            return decode_diff_attention(q1, k1, q2, k2, v, lambda_, weight1=weight1, attn_mask=attn_mask,
                                         is_causal=is_causal, scale=scale).to(v.dtype)
        blockwise = backend == "blockwise"  # decided once, here
        if blockwise:
            backend = "sdpa"  # the sdpa backend's query-block training path
    if _empty(q1, v, nk):
        backend = "math"  # the fused kernels reject empty tensors; the maps are empty or the output is 0

    if backend == "math":
        mask = prepare_mask(attn_mask, is_causal=is_causal, nq=nq, nk=nk, dtype=compute_dtype(q1.dtype),
                            device=q1.device, scale=0.0)
        out, weights = _math(q1, k1, q2, k2, v, lambda_, weight1, mask, scale, softcap, dropout_p)
    elif _branches_in_float32(q1):  # CPU half precision: A1 V and A2 V in float32, subtracted in float32
        mask = prepare_mask(attn_mask, is_causal=is_causal, nq=nq, nk=nk, dtype=compute_dtype(q1.dtype),
                            device=q1.device, scale=scale)
        wq1, wk1, wq2, wk2, wv, wpairs = _widened(q1, k1, q2, k2, v, pairs)
        with torch.autocast("cpu", enabled=False):
            out, weights = _sdpa(wq1, wk1, wq2, wk2, wv, lambda_, weight1, mask, scale, dropout_p, wpairs, False)
        if mask.row_ok is not None:
            out = out.masked_fill(~mask.row_ok, 0.0)
    else:
        mask = prepare_mask(attn_mask, is_causal=is_causal, nq=nq, nk=nk, dtype=q1.dtype, device=q1.device,
                            scale=scale)
        out, weights = _sdpa(q1, k1, q2, k2, v, lambda_, weight1, mask, scale, dropout_p, pairs, blockwise)
        if mask.row_ok is not None:
            out = out.masked_fill(~mask.row_ok, 0.0)
    out = out.to(v.dtype)  # the one rounding to the inputs' precision
    if return_weights:
        return out, weights
    return out


@dataclass(frozen=True)
class BackendChoice:
    """What ``backend="auto"`` runs for some inputs, and why (:func:`choose_backend`).

    ``backend`` is one of ``math``, ``sdpa``, ``triton``, or one of the two paths ``auto`` takes on the CPU:
    ``decode`` (:func:`decode_diff_attention`, a few query rows against a KV cache) and ``blockwise`` (the ``sdpa``
    backend's training path through query blocks, :mod:`diffattn.ops.blockwise`)."""

    backend: str
    why: Callable[[], str] = field(repr=False, compare=False)  # the reason, written only when asked for

    @property
    def reason(self) -> str:
        return self.why()

    def __str__(self) -> str:
        return f"{self.backend}: {self.reason}"


def _auto_backend(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p, softcap,
                  return_weights) -> BackendChoice:
    """The ``auto`` rule on validated inputs (``scale`` a float): the one place it is written. Each reason is a
    function, so that ``diff_attention``, which needs only the backend, formats none of them."""
    nq, nk, dv = int(q1.shape[2]), int(k1.shape[2]), int(v.shape[-1])
    if return_weights:
        return BackendChoice("math", lambda: "return_weights=True needs the attention maps, which only math builds")
    if softcap is not None:
        return BackendChoice("math", lambda: "softcap: only math soft-caps the logits")
    if _empty(q1, v, nk):
        return BackendChoice("math", lambda: f"empty inputs (q {tuple(q1.shape)}, k {tuple(k1.shape)}, "
                                             f"v {tuple(v.shape)})")
    if q1.device.type == "cuda":
        if scale <= 0:
            return BackendChoice("sdpa", lambda: f"scale={scale} ≤ 0: the fused kernel is not taken")
        if _triton_preferred(q1, dv, nk) is None:
            return BackendChoice("sdpa", lambda: f"{nk} keys: {_triton_rule_text(q1, dv)}")
        reason = _triton_reason(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p)
        if reason is not None:
            return BackendChoice("sdpa", lambda: f"the fused kernel cannot run these inputs: {reason}")
        return BackendChoice("triton", lambda: f"{nk} keys: {_triton_rule_text(q1, dv)}")
    if q1.device.type == "cpu" and dropout_p == 0.0 and _decode_preferred(nq, nk):
        return BackendChoice("decode", lambda: f"{nq} query rows against {nk} keys (≤ {DECODE_MAX_QUERIES} rows, "
                                               f"fewer than the keys): decode_diff_attention reads K and V once at "
                                               f"their own width")
    if _blockwise_preferred(q1, k1, q2, k2, v, lambda_, weight1, dropout_p):
        return BackendChoice("blockwise", lambda: f"CPU training from {BLOCKWISE_MIN_KEYS} keys on (here {nk}), "
                                                  f"value wider than the queries: A1 and A2 are combined before one "
                                                  f"product by V")
    padded = " (Q and K padded to the value width)" if dv > int(q1.shape[-1]) else ""
    return BackendChoice("sdpa", lambda: f"PyTorch's fused attention, one call per branch{padded}")


def choose_backend(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
                   lambda_: Weight = 0.5, *, weight1: Weight | None = None, attn_mask: torch.Tensor | None = None,
                   is_causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                   softcap: float | None = None, return_weights: bool = False) -> BackendChoice:
    """Which path :func:`diff_attention` with ``backend="auto"`` takes for these arguments, and why; the same
    arguments, validated the same way. The differential layers ask the same question before handing their λ and
    sub-norm to the fused kernels.

    >>> q = torch.randn(1, 2, 5, 16)
    >>> choose_backend(q, q, q, q, torch.randn(1, 2, 5, 32)).backend
    'sdpa'
    """
    _validate(q1, k1, q2, k2, v)
    _check_options(is_causal, scale, dropout_p, softcap, "auto")
    B, H, nq, d = q1.shape
    lambda_ = _check_weight("lambda_", lambda_, (B, H, nq, 1), q1.device)
    weight1 = _check_weight("weight1", weight1, (B, H, nq, 1), q1.device)
    _check_mask(attn_mask, (B, H, nq, k1.shape[2]), q1.device)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return _auto_backend(q1, k1, q2, k2, v, lambda_, 1.0 if weight1 is None else weight1, attn_mask, is_causal,
                         scale, dropout_p, softcap, return_weights)


def diff_attention_pairs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lambda_: Weight,
    *,
    k_paired: bool = True,
    weight1: Weight | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    softcap: float | None = None,
    backend: str = "auto",
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, AttentionWeights]:
    """:func:`diff_attention` with the two branches' query heads interleaved in one tensor, as the layers project
    them (Ye et al. 2024, §2.1: head i's [Q1; Q2] is one projection of width 2d), as flash-attn's
    ``flash_attn_qkvpacked_func`` takes its heads packed.

    Args:
        q: (B, 2H, Nq, d): branch 1 the even heads, branch 2 the odd ones.
        k: (B, 2Hkv, Nk, d) likewise when ``k_paired``, else one K (B, Hkv, Nk, d) for both branches (Diff
            Transformer V2, Ye et al. 2026; DAA).
        v: as :func:`diff_attention`; so are ``lambda_`` and the keywords.

    The same numbers as ``diff_attention(q[:, 0::2], k[:, 0::2], q[:, 1::2], k[:, 1::2], v, ...)`` (``k`` for both
    keys when not ``k_paired``), with fewer ops: the ``sdpa`` path pads Q and K once each instead of once per
    branch, and the backward joins each pair in one ``stack``.
    """
    if not isinstance(k_paired, bool):
        raise ValueError(f"k_paired must be a bool, got {type(k_paired).__name__}")
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, heads, N, d), got {got}")
        if (name == "q" or k_paired) and int(t.shape[1]) % 2:
            raise ValueError(f"{name} must hold head pairs (an even head count: branch 1 the even heads, branch 2 "
                             f"the odd ones), got shape {tuple(t.shape)}")
    q1, q2 = _split_pairs(q)
    k1, k2 = _split_pairs(k) if k_paired else (k, k)
    return _diff_attention(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p, softcap,
                           backend, return_weights, (q, k, k_paired))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    softcap: float | None = None,
    backend: str = "auto",
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Standard attention O = softmax(cap(Q Kᵀ s) + M) V (Vaswani et al. 2017), with the conventions of
    :func:`diff_attention`: GQA, bool/float masks, end-aligned causal mask, soft-capping, fully masked rows give 0.

    q: (B, H, Nq, d); k: (B, Hkv, Nk, d); v: (B, Hkv, Nk, dv). Returns (B, H, Nq, dv), and the (B, H, Nq, Nk)
    map when ``return_weights`` (``math`` backend). ``backend`` "triton" is not offered here (standard attention
    is what SDPA's own kernels do best).
    """
    _validate(q, k, q, k, v, names=("q", "k", "q", "k"))
    _check_options(is_causal, scale, dropout_p, softcap, backend)
    B, H, nq, d = q.shape
    nk = k.shape[2]
    _check_mask(attn_mask, (B, H, nq, nk), q.device)
    if backend == "triton":
        raise ValueError("backend='triton' is for differential attention; use 'auto', 'math' or 'sdpa'")
    if return_weights and backend not in ("auto", "math"):
        raise ValueError(f"return_weights=True needs backend 'math' or 'auto', got backend={backend!r}")
    if softcap is not None and backend not in ("auto", "math"):
        raise ValueError(f"softcap={softcap} needs backend 'math' or 'auto' (the sdpa kernels do not soft-cap "
                         f"logits), got backend={backend!r}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    groups = int(H) // int(k.shape[1])  # a Python int, also under torch.jit.trace (enable_gqa must be a bool)
    if return_weights or softcap is not None or backend == "math" or _empty(q, v, nk):
        mask = prepare_mask(attn_mask, is_causal=is_causal, nq=nq, nk=nk, dtype=compute_dtype(q.dtype),
                            device=q.device, scale=0.0)
        k, v = _expand_kv(k, groups), _expand_kv(v, groups)
        p = _probs(q, k, mask, scale, softcap, 0.0)
        pd = F.dropout(p, p=dropout_p, training=True) if dropout_p > 0.0 else p
        out = torch.matmul(pd.to(v.dtype), v)
        return (out, p) if return_weights else out
    mask = prepare_mask(attn_mask, is_causal=is_causal, nq=nq, nk=nk, dtype=q.dtype, device=q.device, scale=scale)
    if groups > 1 and torch.onnx.is_in_onnx_export():  # the TorchScript ONNX exporter has no SDPA with enable_gqa
        k, v, groups = _expand_kv(k, groups), _expand_kv(v, groups), 1
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.additive(), dropout_p=dropout_p,
                                         is_causal=mask.sdpa_causal, scale=scale, enable_gqa=groups > 1)
    if mask.row_ok is not None:
        out = out.masked_fill(~mask.row_ok, 0.0)
    return out
