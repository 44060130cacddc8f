"""The differential attention operator and its backends.

    O = (w1 ⊙ A1 − λ ⊙ A2) V,   A1 = softmax(Q1 K1ᵀ · s + M),   A2 = softmax(Q2 K2ᵀ · s + M)

Ye et al. 2024 ("Differential Transformer", eq. 1) with w1 = 1 and one λ per layer; DiffCLIP (seed 000, §3.1) and
seed 003's module use the same form. The M-DGSA gate (seed 004, §3) passes w1 = g and λ = 1 − g per token and head,
which is why both weights broadcast to (B, H, Nq, 1): a weight that scales a whole query row commutes with the
product by V, (g ⊙ A) V = g ⊙ (A V), so every O(N) backend serves the gate too.

Backends
- ``math``: materialises A1 and A2 (softmax in float32); the only one that can return the maps.
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``; never builds an N×N tensor of its own. Since
  (w1 A1 − λ A2) V = w1 (A1 V) − λ (A2 V), it runs ordinary attention per branch and subtracts.
- ``triton``: the fused one-pass GPU kernel in :mod:`diffattn.kernels` (CUDA only).
- ``auto``: ``triton`` on CUDA when the kernel applies, else ``sdpa``; ``math`` only when weights are asked for.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["diff_attention", "attention", "causal_mask", "restrict_mask", "AttentionWeights", "BACKENDS"]

BACKENDS = ("auto", "math", "sdpa", "triton")

Weight = float | torch.Tensor


class AttentionWeights(NamedTuple):
    """Maps returned by ``return_weights=True``: each (B, H, Nq, Nk)."""

    first: torch.Tensor  # A1
    second: torch.Tensor  # A2
    combined: torch.Tensor  # w1 ⊙ A1 − λ ⊙ A2


# --------------------------------------------------------------------------------------------- validation


def _check_broadcast(name: str, t: torch.Tensor, target: tuple[int, ...], what: str) -> None:
    if t.dim() > len(target):
        raise ValueError(f"{name} must have at most {len(target)} dims broadcastable to {what} {target}, "
                         f"got shape {tuple(t.shape)}")
    for got, want in zip(reversed(t.shape), reversed(target)):
        if got != 1 and got != want:
            raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to {what} {target}; "
                             f"each dim must be 1 or match (right-aligned)")


def _check_weight(name: str, w: Weight | None, shape: tuple[int, ...], device: torch.device) -> None:
    if w is None or isinstance(w, (int, float)):
        return
    if not isinstance(w, torch.Tensor):
        raise ValueError(f"{name} must be a float or a tensor, got {type(w).__name__}")
    if not w.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {w.dtype}")
    if w.device != device:
        raise ValueError(f"{name} is on {w.device} but the inputs are on {device}")
    _check_broadcast(name, w, shape, "(B, H, Nq, 1)")


def _validate(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, dropout_p, backend, names=("q1", "k1", "q2", "k2")):
    n_q1, n_k1, n_q2, n_k2 = names
    for name, t in ((n_q1, q1), (n_k1, k1), (n_q2, q2), (n_k2, k2), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, heads, N, width), got {got}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floating point, got dtype {t.dtype}")
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
    _check_weight("lambda_", lambda_, (B, H, Nq, 1), q1.device)
    _check_weight("weight1", weight1, (B, H, Nq, 1), q1.device)
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise ValueError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise ValueError(f"attn_mask must be bool (True = attend) or an additive float mask, "
                             f"got dtype {attn_mask.dtype}")
        if attn_mask.device != q1.device:
            raise ValueError(f"attn_mask is on {attn_mask.device} but the inputs are on {q1.device}")
        _check_broadcast("attn_mask", attn_mask, (B, H, Nq, Nk), "(B, H, Nq, Nk)")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


# ------------------------------------------------------------------------------------------------ masks


def causal_mask(nq: int, nk: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool (Nq, Nk) causal mask aligned to the end: query i sees keys j ≤ i + (Nk − Nq).

    With a KV cache the Nq new queries are the last Nq positions of the Nk keys.
    """
    i = torch.arange(nq, device=device).unsqueeze(1)
    j = torch.arange(nk, device=device).unsqueeze(0)
    return j <= i + (nk - nq)


def restrict_mask(mask: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor:
    """``mask`` (bool, True = attend, or additive float; or None) further limited to where bool ``keep`` is True."""
    if mask is None:
        return keep
    if mask.dtype == torch.bool:
        return mask & keep
    return mask.masked_fill(~keep, torch.finfo(mask.dtype).min)


def _masked(mask: torch.Tensor) -> torch.Tensor:
    """True where a mask entry blocks attention (bool False, float −inf or ≤ finfo.min / 2)."""
    if mask.dtype == torch.bool:
        return ~mask
    return mask <= torch.finfo(mask.dtype).min / 2


def _prepare_mask(attn_mask, is_causal, nq, nk, device):
    """Merge the causal mask into ``attn_mask`` and make every row attend to something.

    Returns (mask, row_ok, sdpa_causal): ``mask`` has no fully masked row (such rows are opened so that the
    kernels stay finite), ``row_ok`` is a bool (…, Nq, 1) tensor, False where the caller's row was fully masked
    (the output there is set to exactly 0), or None when no row can be fully masked. ``sdpa_causal`` says
    the causal mask was left to the kernel (Nq == Nk and no other mask).
    """
    if is_causal and attn_mask is None and nq == nk:
        return None, None, True
    mask = restrict_mask(attn_mask, causal_mask(nq, nk, device)) if is_causal else attn_mask
    if mask is None:
        return None, None, False
    row_ok = ~_masked(mask).all(dim=-1, keepdim=True)  # (..., Nq, 1)
    if mask.dtype == torch.bool:
        mask = mask | ~row_ok
    else:
        mask = torch.where(row_ok, mask, torch.zeros((), dtype=mask.dtype, device=mask.device))
    return mask, row_ok, False


def _as_weight(w: Weight | None, default: float) -> Weight:
    return default if w is None else w


def _combine(o1, o2, weight1, lambda_):
    out = o1 * weight1 if not (isinstance(weight1, (int, float)) and weight1 == 1.0) else o1
    return out - o2 * lambda_


def _upcast(t: torch.Tensor) -> torch.Tensor:
    """To float32, or float64 when the input already is."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _expand_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


# --------------------------------------------------------------------------------------------- backends


def _probs(q, k, mask, row_ok, scale, dropout_p):
    """softmax(Q Kᵀ s + M) in ≥ float32, (B, H, Nq, Nk); rows the caller fully masked are set to 0."""
    s = _upcast(torch.matmul(q, k.transpose(-2, -1))) * scale
    if mask is not None:
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min) if mask.dtype == torch.bool else s + mask.to(s.dtype)
    p = torch.softmax(s, dim=-1)
    if row_ok is not None:
        p = p * row_ok
    return F.dropout(p, p=dropout_p, training=True) if dropout_p > 0.0 else p


def _math(q1, k1, q2, k2, v, lambda_, weight1, mask, row_ok, is_causal, scale, dropout_p):
    groups = q1.shape[1] // k1.shape[1]
    k1, k2, v = (_expand_kv(t, groups) for t in (k1, k2, v))
    if is_causal:  # only reached with mask None and nq == nk
        mask = causal_mask(q1.shape[2], k1.shape[2], q1.device)
    a1 = _probs(q1, k1, mask, row_ok, scale, dropout_p)
    a2 = _probs(q2, k2, mask, row_ok, scale, dropout_p)
    w1 = _upcast(weight1) if isinstance(weight1, torch.Tensor) else weight1
    lam = _upcast(lambda_) if isinstance(lambda_, torch.Tensor) else lambda_
    a = _combine(a1, a2, w1, lam)  # (B, H, Nq, Nk)
    out = torch.matmul(a.to(v.dtype), v)
    return out, AttentionWeights(a1, a2, a)


def _sdpa(q1, k1, q2, k2, v, lambda_, weight1, mask, row_ok, is_causal, scale, dropout_p):
    """One call of PyTorch's fused attention per branch, then O = w1 ⊙ (A1 V) − λ ⊙ (A2 V).

    Fused kernels (the CPU flash kernel, CUDA FlashAttention-2) need q/k and v of one width, and v is 2d wide.
    Q and K are zero-padded to width dv (Q Kᵀ is unchanged; the scale is passed explicitly) and both calls read the
    same V, which autograd then saves once. GQA goes to the kernel (``enable_gqa``), so K and V are never
    repeated. Measured on a 2-core CPU (docs/benchmarks.md): four calls on width-d halves of V compute each
    softmax twice and are slower; stacking the branches into one call needs a second copy of V, 2.1× the peak
    memory of standard attention against 1.65× here.
    """
    H, d = q1.shape[1], q1.shape[3]
    Hkv, dv = k1.shape[1], v.shape[-1]
    width = max(d, dv)

    def padded(t: torch.Tensor) -> torch.Tensor:  # (B, h, N, w) -> (B, h, N, width), one allocation
        if t.shape[-1] == width:
            return t
        buf = t.new_zeros(*t.shape[:-1], width)
        buf[..., : t.shape[-1]] = t
        return buf

    vv = padded(v)  # (B, Hkv, Nk, width)
    o1, o2 = (
        F.scaled_dot_product_attention(padded(q), padded(k), vv, attn_mask=mask, dropout_p=dropout_p,
                                       is_causal=is_causal, scale=scale, enable_gqa=H != Hkv)[..., :dv]
        for q, k in ((q1, k1), (q2, k2))
    )  # each (B, H, Nq, dv)
    return _combine(o1, o2, weight1, lambda_), None


def _triton(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p):
    from .kernels import triton_diff_attention

    return triton_diff_attention(q1, k1, q2, k2, v, lambda_, weight1=weight1, attn_mask=attn_mask,
                                 is_causal=is_causal, scale=scale, dropout_p=dropout_p)


def _triton_reason(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p) -> str | None:
    """Why the fused kernel cannot take these inputs, or None when it can."""
    if q1.device.type != "cuda":
        return f"the triton backend needs CUDA tensors, got device {q1.device.type}"
    try:
        from .kernels import triton_unsupported_reason
    except ImportError as e:  # pragma: no cover - triton missing
        return f"triton is not importable ({e})"
    return triton_unsupported_reason(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p)


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
    backend: str = "auto",
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, AttentionWeights]:
    """Differential attention O = (w1 ⊙ A1 − λ ⊙ A2) V (Ye et al. 2024, eq. 1; seed 004, eq. 3 for the gate).

    Args:
        q1, q2: (B, H, Nq, d) queries of the two branches.
        k1, k2: (B, Hkv, Nk, d) keys; H must be divisible by Hkv (grouped-query attention: query head i reads
            key/value head i // (H / Hkv)).
        v: (B, Hkv, Nk, dv) values, shared by both branches (dv = 2d in Ye et al.'s layout).
        lambda_: λ, a float or a tensor broadcastable to (B, H, Nq, 1): per layer, per head or per token and head.
        weight1: w1 on A1, same shapes as λ; default 1.
        attn_mask: bool (True = attend) or additive float mask broadcastable to (B, H, Nq, Nk).
        is_causal: causal mask aligned to the end (query i sees keys ≤ i + Nk − Nq), combined with attn_mask.
        scale: s in softmax(Q Kᵀ s); default 1/√d.
        dropout_p: dropout on each attention map (independently), applied only when > 0.
        backend: "auto", "math", "sdpa" or "triton" (see the module docstring).
        return_weights: also return :class:`AttentionWeights` (A1, A2, combined); needs the ``math`` backend.

    Returns:
        (B, H, Nq, dv) output in the dtype of ``v``, and the maps when ``return_weights``. A query row whose every
        key is masked gives exactly 0.
    """
    _validate(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, dropout_p, backend)
    nq, nk, d = q1.shape[2], k1.shape[2], q1.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    weight1 = _as_weight(weight1, 1.0)
    if return_weights and backend not in ("auto", "math"):
        raise ValueError(f"return_weights=True needs backend 'math' or 'auto', got backend={backend!r}")

    if backend == "auto":
        if return_weights:
            backend = "math"
        elif q1.device.type == "cuda" and _triton_reason(q1, k1, q2, k2, v, lambda_, weight1, attn_mask,
                                                          is_causal, dropout_p) is None:
            backend = "triton"
        else:
            backend = "sdpa"
    if backend == "triton":
        reason = _triton_reason(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, dropout_p)
        if reason is not None:
            raise ValueError(f"backend='triton' cannot run these inputs: {reason}")
        return _triton(q1, k1, q2, k2, v, lambda_, weight1, attn_mask, is_causal, scale, dropout_p)

    mask, row_ok, sdpa_causal = _prepare_mask(attn_mask, is_causal, nq, nk, q1.device)
    fn = _math if backend == "math" else _sdpa
    out, weights = fn(q1, k1, q2, k2, v, lambda_, weight1, mask, row_ok, sdpa_causal, scale, dropout_p)
    if row_ok is not None and backend != "math":
        out = out.masked_fill(~row_ok, 0.0)
    out = out.to(v.dtype)
    if return_weights:
        return out, weights
    return out


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Standard attention O = softmax(Q Kᵀ s + M) V (Vaswani et al. 2017), with the conventions of
    :func:`diff_attention`: GQA, bool/float masks, end-aligned causal mask, fully masked rows give 0.

    q: (B, H, Nq, d); k: (B, Hkv, Nk, d); v: (B, Hkv, Nk, dv). Returns (B, H, Nq, dv), and the (B, H, Nq, Nk)
    map when ``return_weights`` (``math`` backend). ``backend`` "triton" is not offered here (standard attention
    is what SDPA's own kernels do best).
    """
    _validate(q, k, q, k, v, None, None, attn_mask, dropout_p, backend, names=("q", "k", "q", "k"))
    if backend == "triton":
        raise ValueError("backend='triton' is for differential attention; use 'auto', 'math' or 'sdpa'")
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    mask, row_ok, sdpa_causal = _prepare_mask(attn_mask, is_causal, nq, nk, q.device)
    groups = q.shape[1] // k.shape[1]
    if return_weights or backend == "math":
        k, v = _expand_kv(k, groups), _expand_kv(v, groups)
        if sdpa_causal:
            mask = causal_mask(nq, nk, q.device)
        p = _probs(q, k, mask, row_ok, scale, 0.0)
        pd = F.dropout(p, p=dropout_p, training=True) if dropout_p > 0.0 else p
        out = torch.matmul(pd.to(v.dtype), v)
        return (out, p) if return_weights else out
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=sdpa_causal,
                                         scale=scale, enable_gqa=groups > 1)
    if row_ok is not None:
        out = out.masked_fill(~row_ok, 0.0)
    return out
