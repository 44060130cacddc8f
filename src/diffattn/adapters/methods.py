"""The math of every retrofit: one adapter module per retrofitted attention layer.

Per standard head of width d (h query heads, model width D), with the pretrained W_q, W_k, W_v, W_o kept:

| method          | second branch                        | output                                    | new params |
|-----------------|--------------------------------------|-------------------------------------------|------------|
| ``daa``         | A2 = A(Q W_daa, K), W_daa (h, d, d)  | (A1 − λ(t) A2) V                          | D²/h (+1)  |
| ``dex``         | none                                 | (A1 V)(I − λ(t) W_dex), W_dex (h, d, d)   | D²/h (+1)  |
| ``diffq``       | Q2 = (X W_dq) W_q, W_dq (D, D)       | (A(Q1, K) − λ(t) A(Q2, K)) V              | D² (+1)    |
| ``diffk``       | K2 = (X W_dk) W_k, W_dk (D, D)       | (A(Q, K1) − λ(t) A(Q, K2)) V              | D² (+1)    |
| ``diffv``       | V2 = (X W_dv) W_v, W_dv (D, D)       | A (V1 − λ(t) V2)                          | D² (+1)    |
| ``shared_qk``   | A2 = A1                              | (1 − λ_init)·RMSNorm((A1 − λ A1) V)        | 4d + d     |
| ``split_heads`` | Q/K channels of a head in 2 groups   | (1 − λ_init)·RMSNorm((A1 − λ A2) V)       | 2d + d     |

DAA (2025): eq. 3 for λ(t), eq. 4 for DAA, eq. 11 for DEX (after Kong et al. 2025), App. B for the parameter
counts, App. D for the pseudocode (every new matrix is the identity at init). λ(t) is
:class:`diffattn.lambdas.AnnealedLambda`: λ(0) = 0, so at step 0 the layer computes the pretrained function exactly,
and the (t/T)·λ_init ramp moves it off that point even while every new matrix is still the identity.

Li et al. 2025 (§3.2 "original" = ``split_heads``, §3.3 "proposed" = ``shared_qk``): λ is re-parameterised (Ye et al.
2024 eq. 2, :class:`~diffattn.lambdas.ReparamLambda`), each head output goes through an RMSNorm of the head width and
is scaled by (1 − λ_init). These layers do **not** compute the pretrained function (the RMSNorm alone changes it), so
to keep the library's promise that a retrofit starts from the pretrained model, their output is blended in over the
annealing window: O = (1 − β) O_pretrained + β O_diff, β(t) = min(1, t/T). From t = T on the layer is exactly
Li et al.'s. This blend is our addition, not the paper's.

shared-QK is degenerate, faithfully so: (A1 − λ A1) V = (1 − λ) A1 V, and the RMSNorm that follows removes every
dependence on λ except its sign (Li et al.'s public code has the same property). We implement it as published.

split-heads splits the d channels of each pretrained Q/K head into two groups of d/2 that keep rotary pairs
(channel i and i + d/2 under ``rotate_half`` RoPE) together: G1 = [0, d/4) ∪ [d/2, 3d/4), G2 = the rest, so each
branch's scores stay functions of relative position. Scale: the model's scale × √2 (the width halves); λ vectors
have the branch width d/2 (Ye et al. 2024); V keeps width d.

DAA applies W_daa to the query **before** rotary embedding (when the model has one), so A2 stays a function of
relative positions; at init both orders agree.

Every method computes its attention with :func:`diffattn.functional.diff_attention` or
:func:`diffattn.functional.attention` (:func:`run_method`), so masks, grouped-query attention, fully masked rows and
the backends (SDPA, the fused Triton kernel on CUDA) have one implementation. A float64 model computes in float64
throughout, λ included; lower precisions keep λ in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn

from .. import functional
from ..functional import AttentionWeights
from ..lambdas import AnnealedLambda, ReparamLambda, resolve_lambda_init
from ..layers.norm import head_rms_norm

__all__ = [
    "METHODS",
    "SEED001_METHODS",
    "SEED002_METHODS",
    "INPUT_METHODS",
    "MAX_STEP",
    "RetrofitAdapter",
    "run_method",
    "branch_maps",
    "second_branch",
    "split_channels",
]

#: methods of DAA (2025) (DEX: Kong et al. 2025), annealed λ(t); the names are kept for compatibility
SEED001_METHODS = ("daa", "dex", "diffq", "diffk", "diffv")
#: methods of Li et al. 2025, re-parameterised λ and per-head RMSNorm
SEED002_METHODS = ("shared_qk", "split_heads")
METHODS = SEED001_METHODS + SEED002_METHODS

#: which projection input a method transforms: X' = X W_d{q,k,v} (DAA (2025) App. D.2)
INPUT_METHODS = {"diffq": "q", "diffk": "k", "diffv": "v"}

#: the largest schedule step t a layer can hold (its ``step`` buffer is an int64)
MAX_STEP = 2**63 - 1


def _lambda_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """λ in float32, or float64 for a float64 model."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class RetrofitAdapter(nn.Module):
    """The new weights of one retrofitted attention layer and the λ that weighs them.

    A plain ``nn.Module`` (peft's ``modules_to_save`` can wrap it). Attributes, by method:
    ``W_daa`` / ``W_dex`` (h, d, d); ``W_dq`` / ``W_dk`` / ``W_dv`` (D, D), all identity at init;
    ``lam``: :class:`AnnealedLambda` (DAA (2025) methods, holds ``lambda_learn`` and the ``step`` buffer) or
    :class:`ReparamLambda` (Li et al. 2025 methods, which also have ``diff_norm``, an RMSNorm of width d, and their
    own ``step``).

    Args:
        method: one of :data:`METHODS`.
        dim: D, the width of the layer input.
        num_heads: h, the query head count of the pretrained layer.
        head_dim: d, the pretrained head width.
        lambda_init: λ_init, a finite float or ``"ye"`` (0.8 − 0.6·exp(−0.3·l) with ``layer_index`` l, 0-based).
        anneal_steps: T of DAA (2025) eq. 3 (and of the blend).
        layer_index: 0-based index of this layer among the retrofitted model's attention layers.
        value_dim: the width of a value head when it differs from the query/key head width ``head_dim``
            (Ultralytics' ``Attention``); ``W_dex`` and ``diff_norm`` act on it. Default ``head_dim``.
    """

    def __init__(self, method: str, *, dim: int, num_heads: int, head_dim: int, lambda_init: float | str = 0.8,
                 anneal_steps: int = 1000, layer_index: int = 0, value_dim: int | None = None, device=None,
                 dtype=None):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if isinstance(anneal_steps, bool) or not isinstance(anneal_steps, int) or anneal_steps <= 0:
            raise ValueError(f"anneal_steps must be a positive int, got {anneal_steps!r}")
        if method == "split_heads" and head_dim % 4 != 0:
            raise ValueError(f"method 'split_heads' needs a head width divisible by 4 (to split rotary pairs "
                             f"evenly), got head_dim={head_dim}")
        self.method = method
        self.dim, self.num_heads, self.head_dim = int(dim), int(num_heads), int(head_dim)
        self.value_dim = self.head_dim if value_dim is None else int(value_dim)
        self.layer_index = int(layer_index)
        self.lambda_init = resolve_lambda_init(lambda_init, layer_index)
        if not math.isfinite(self.lambda_init):
            raise ValueError(f"lambda_init must be finite, got {self.lambda_init!r}")
        self.anneal_steps = int(anneal_steps)
        #: set by ``capture_attention``: keep the maps of every forward call in ``last_maps``
        self.keep_maps = False
        self.last_maps: AttentionWeights | None = None
        f = {"device": device, "dtype": dtype}
        lam_f = {"device": device, "dtype": _lambda_dtype(dtype)}
        h, d, D, dv = self.num_heads, self.head_dim, self.dim, self.value_dim
        if method == "daa":
            self.W_daa = nn.Parameter(torch.eye(d, **f).repeat(h, 1, 1))  # (h, d, d)
        elif method == "dex":
            self.W_dex = nn.Parameter(torch.eye(dv, **f).repeat(h, 1, 1))  # (h, dv, dv)
        elif method in INPUT_METHODS:
            setattr(self, f"W_d{INPUT_METHODS[method]}", nn.Parameter(torch.eye(D, **f)))  # (D, D)
        if method in SEED001_METHODS:
            self.lam = AnnealedLambda(self.lambda_init, self.anneal_steps).to(**lam_f)
        else:
            width = d if method == "shared_qk" else d // 2
            self.lam = ReparamLambda(width, self.lambda_init).to(**lam_f)
            self.diff_norm = head_rms_norm(dv).to(**f)
            self.register_buffer("step", torch.zeros((), dtype=torch.long, device=device))

    # ------------------------------------------------------------------------------------------ schedule

    @property
    def step_buffer(self) -> torch.Tensor:
        """The step counter t (a 0-d long buffer in the state dict)."""
        return self.lam.step if self.method in SEED001_METHODS else self.step

    @torch.no_grad()
    def advance(self, n: int = 1) -> None:
        """t ← t + n; call once per optimizer step (:func:`diffattn.adapters.step` does it for a model).

        Raises ValueError when t + n would not fit the int64 step buffer (t ≤ :data:`MAX_STEP`)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int (optimizer steps), got {n!r}")
        t = int(self.step_buffer)
        if n > self.max_advance():
            raise ValueError(f"n={n} would take the schedule step from {t} past {MAX_STEP} (the int64 step "
                             f"counter); λ(t) is constant for t ≥ anneal_steps={self.anneal_steps}, so advance by "
                             f"at most {MAX_STEP - t}")
        self.step_buffer.add_(n)

    def max_advance(self) -> int:
        """The largest n :meth:`advance` accepts now (t + n ≤ :data:`MAX_STEP`)."""
        return MAX_STEP - int(self.step_buffer)

    def lambda_value(self) -> torch.Tensor:
        """λ(t) (DAA (2025) eq. 3) or the re-parameterised λ (Ye et al. 2024 eq. 2): a 0-d tensor in float32
        (float64 for a float64 model)."""
        return self.lam.value().reshape(())

    def blend(self) -> torch.Tensor:
        """β(t) = min(1, t/T) for the Li et al. 2025 methods (weight of their output); 1 is "fully differential"."""
        dtype = self.lam.lambda_q1.dtype if self.method in SEED002_METHODS else self.lam.lambda_learn.dtype
        return torch.clamp(self.step_buffer.to(dtype) / self.anneal_steps, max=1.0)

    # --------------------------------------------------------------------------------------- transforms

    def transform_input(self, x: torch.Tensor) -> torch.Tensor:
        """X' = X W_d for DiffQ / DiffK / DiffV (DAA (2025) App. D.2). x: (B, N, D)."""
        w = getattr(self, f"W_d{INPUT_METHODS[self.method]}")
        return torch.matmul(x, w.to(x.dtype))  # (B, N, D)

    def transform_query(self, q: torch.Tensor) -> torch.Tensor:
        """Q W_daa per head (DAA (2025) eq. 4). q: (B, h, N, d) → (B, h, N, d)."""
        return torch.einsum("bhnd,hde->bhne", q, self.W_daa.to(q.dtype))

    def extra_repr(self) -> str:
        return (f"method={self.method!r}, dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"lambda_init={self.lambda_init:.4g}, anneal_steps={self.anneal_steps}")


# ------------------------------------------------------------------------------------ the second branch

Project = Callable[[torch.Tensor, str], torch.Tensor]


def second_branch(adapter: RetrofitAdapter, x: torch.Tensor, q: torch.Tensor,
                  project: Project) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The second-branch tensors (q2, k2, v2) of a retrofitted layer, None where the branch reuses the first.

    ``x`` (B, N, D) is the layer input and ``q`` (B, h, N, d) the first-branch query (before any rotary embedding);
    ``project(x', which)`` runs the pretrained projection ``which`` ("q", "k" or "v") on x' and returns its heads
    (B, heads, N, d), with whatever per-head step the family applies to that projection (timm's q/k norm).
    DiffQ / DiffK / DiffV project X W_d (DAA (2025) App. D.2); DAA rotates the query, Q W_daa (eq. 4); the other
    methods have no second projection.
    """
    which = INPUT_METHODS.get(adapter.method)
    if which is not None:
        t = project(adapter.transform_input(x), which)  # (B, heads, N, d)
        return tuple(t if w == which else None for w in "qkv")  # type: ignore[return-value]
    if adapter.method == "daa":
        return adapter.transform_query(q), None, None
    return None, None, None


# ------------------------------------------------------------------------------------------- attention


def split_channels(head_dim: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel indices of the two split-head groups: G1 = [0, d/4) ∪ [d/2, 3d/4), G2 = the rest (rotary pairs
    i, i + d/2 stay in one group)."""
    d, q4 = head_dim, head_dim // 4
    g1 = torch.cat([torch.arange(0, q4), torch.arange(2 * q4, 3 * q4)]).to(device)
    g2 = torch.cat([torch.arange(q4, 2 * q4), torch.arange(3 * q4, d)]).to(device)
    return g1, g2


#: what a query row whose every key is masked gets: ``"zero"`` (the operator's rule: output 0, map 0) or
#: ``"uniform"`` (the softmax of equal ``finfo.min`` logits: every key weighted 1/Nk, the mean of V, as
#: transformers' eager attention computes it)
MASKED_ROWS = ("zero", "uniform")


def _dead_rows(attn_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(…, Nq) True where every key of the query row is blocked (the operator's rule: False in a bool mask, at or
    below ``finfo.min / 2`` in an additive one), or None when no row is."""
    if attn_mask is None or attn_mask.dim() == 0:
        return None
    blocked = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask <= torch.finfo(attn_mask.dtype).min / 2
    rows = blocked.all(dim=-1)
    return rows if bool(rows.any()) else None


def _uniform_rows(out: torch.Tensor, maps, v: torch.Tensor, rows: torch.Tensor, weight, diff: bool):
    """``out`` (B, h, Nq, dv) and the maps with the ``rows`` whose keys are all masked set to what a softmax over
    equal logits gives: each branch's map 1/Nk, the output ``weight`` · mean over keys of V (weight 1, or 1 − λ for
    A1 − λ A2)."""
    h, nk = out.shape[1], v.shape[-2]
    fill = v.mean(dim=-2, keepdim=True).repeat_interleave(h // v.shape[1], dim=1) * weight  # (B, h, 1, dv)
    dead = rows.unsqueeze(-1)  # (…, Nq, 1)
    out = torch.where(dead, fill.to(out.dtype), out)
    if maps is None:
        return out, None

    def fix(m, value):
        return None if m is None else torch.where(dead, torch.as_tensor(value, dtype=m.dtype, device=m.device), m)

    if diff:
        return out, AttentionWeights(fix(maps.first, 1.0 / nk), fix(maps.second, 1.0 / nk),
                                     fix(maps.combined, weight / nk))
    return out, fix(maps, 1.0 / nk)


def _attn(q, k, v, weights: bool, masked_rows: str = "zero", **kw) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(Q Kᵀ s + M) V through :func:`diffattn.functional.attention`, with the map when ``weights``; fully
    masked query rows as ``masked_rows`` says (:data:`MASKED_ROWS`)."""
    if weights:
        out, p = functional.attention(q, k, v, return_weights=True, **kw)
    else:
        out, p = functional.attention(q, k, v, **kw), None
    rows = _dead_rows(kw.get("attn_mask")) if masked_rows == "uniform" else None
    return (out, p) if rows is None else _uniform_rows(out, p, v, rows, 1.0, diff=False)


def _diff(q1, k1, q2, k2, v, lam, weights: bool, masked_rows: str = "zero",
          **kw) -> tuple[torch.Tensor, AttentionWeights | None]:
    """(A1 − λ A2) V through :func:`diffattn.functional.diff_attention`, with (A1, A2, A1 − λ A2) when ``weights``;
    fully masked query rows as ``masked_rows`` says (:data:`MASKED_ROWS`)."""
    if weights:
        out, ws = functional.diff_attention(q1, k1, q2, k2, v, lam, return_weights=True, **kw)
    else:
        out, ws = functional.diff_attention(q1, k1, q2, k2, v, lam, **kw), None
    rows = _dead_rows(kw.get("attn_mask")) if masked_rows == "uniform" else None
    if rows is None:
        return out, ws
    return _uniform_rows(out, ws, v, rows, (1.0 - torch.as_tensor(lam)).to(v.device, v.dtype), diff=True)


_SELF = "combined"  # a branch that is the combined map itself (DiffV, DEX)


def branch_maps(maps: torch.Tensor) -> AttentionWeights:
    """(A1, A2, combined) of a combined map returned by a retrofitted layer (``output_attentions=True`` in
    transformers, ``need_weights=True`` for open_clip's attention): each (B, h, Nq, Nk), A2 None for the methods
    with one map (DiffV, DEX). See :func:`run_method` for what each method's maps are."""
    branches = getattr(maps, "_diffattn_branches", None)
    if not isinstance(maps, torch.Tensor) or branches is None:
        raise ValueError("maps must be an attention map returned by a layer converted with diffattn.retrofit (e.g. "
                         "model(..., output_attentions=True).attentions[i]), got "
                         f"{type(maps).__name__}{' without branch maps' if isinstance(maps, torch.Tensor) else ''}")
    return AttentionWeights(*(maps if b is _SELF else b for b in branches), maps)


def run_method(adapter: RetrofitAdapter, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
               q2: torch.Tensor | None = None, k2: torch.Tensor | None = None, v2: torch.Tensor | None = None,
               scale: float, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
               dropout_p: float = 0.0, softcap: float | None = None, need_weights: bool = False,
               backend: str = "auto", masked_rows: str = "zero") -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention core of a retrofitted layer, after projection, rotary embedding and cache.

    q, q2: (B, h, Nq, d); k, k2: (B, Hkv, Nk, d); v, v2: (B, Hkv, Nk, d) (h a multiple of Hkv: grouped-query
    attention). ``q2`` (DAA, DiffQ), ``k2`` (DiffK), ``v2`` (DiffV) are the second-branch tensors from
    :func:`second_branch`. ``attn_mask`` (bool, True = attend, or additive float, broadcastable to
    (B, h, Nq, Nk)), ``is_causal`` (end-aligned), ``dropout_p`` (on each map) and ``softcap`` (tanh(S/c)·c on the
    logits, Gemma 2) go to the operator unchanged. A query row whose every key is masked gives 0
    (``masked_rows="zero"``, the operator's rule) or, with ``masked_rows="uniform"``, what a softmax over the
    equal ``finfo.min`` logits gives (every map row 1/Nk, so the pretrained layer's mean of V and each method's
    combination of it): the convention of the family's own eager attention, which a retrofit follows to equal
    the pretrained model at every position at step 0.

    Returns the (B, h, Nq, d) output before the output projection and, with ``need_weights``, the (B, h, Nq, Nk)
    combined map in q's dtype: A1 − λ A2 (DAA, DiffQ, DiffK), A (DiffV, DEX), (1 − λ) A1 (shared-QK), or A1 − λ A2
    on the halves (split-heads); for the Li et al. 2025 methods blended as the output is. The branches travel with
    it (:func:`branch_maps`): A1 and A2 (DAA, DiffQ, DiffK: A2 = A(Q2, K) or A(Q, K2)), A and None (DiffV, DEX: one
    map), A1 and A1 (shared-QK), A1 and A2 of the channel halves (split-heads, not blended). When
    ``adapter.keep_maps`` is True, the maps are also computed without ``need_weights`` and kept, detached, as
    ``adapter.last_maps`` (:class:`~diffattn.functional.AttentionWeights`; what ``capture_attention`` reads).
    """
    m = adapter.method
    if masked_rows not in MASKED_ROWS:
        raise ValueError(f"masked_rows must be one of {MASKED_ROWS}, got {masked_rows!r}")
    kw = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale, "dropout_p": dropout_p,
          "softcap": softcap, "backend": backend, "masked_rows": masked_rows}
    keep = bool(getattr(adapter, "keep_maps", False))
    w = need_weights or keep
    lam = adapter.lambda_value()  # 0-d, float32 (float64 for a float64 model)
    first = second = p = None
    if m in ("daa", "diffq", "diffk"):  # DAA (2025) eq. 4 / App. D: (A1 − λ A2) V
        out, ws = _diff(q, k, q if q2 is None else q2, k if k2 is None else k2, v, lam, w, **kw)
        if ws is not None:
            first, second, p = ws
    elif m == "diffv":  # A (V1 − λ V2) = A V1 − λ A V2
        out, p = _attn(q, k, v - lam.to(v.dtype) * v2, w, **kw)
        first = p
    elif m == "dex":  # DAA (2025) eq. 11: (A1 V)(I − λ W_dex)
        o1, p = _attn(q, k, v, w, **kw)
        first = p
        o_w = torch.einsum("bhnd,hde->bhne", o1, adapter.W_dex.to(o1.dtype))  # (B, h, Nq, d)
        out = o1 - lam.to(o1.dtype) * o_w
    else:
        beta = adapter.blend()
        full = bool(beta >= 1.0)
        if m == "shared_qk":  # (A1 − λ A1) V = (1 − λ) A1 V, Li et al. 2025 §3.3
            o1, p1 = _attn(q, k, v, w, **kw)
            od = (1.0 - lam).to(o1.dtype) * o1
            pd = None if p1 is None else (1.0 - lam).to(p1.dtype) * p1
            first = second = p1
        else:  # Ye et al. 2024 eq. 1 on the two channel groups, Li et al. 2025 §3.2
            g1, g2 = split_channels(q.shape[-1], q.device)
            od, ws = _diff(q[..., g1], k[..., g1], q[..., g2], k[..., g2], v, lam, w,
                           **dict(kw, scale=scale * math.sqrt(2.0)))
            first, second, pd = ws if ws is not None else (None, None, None)
            o1, p1 = (None, None) if full else _attn(q, k, v, w, **kw)
        od = adapter.diff_norm(od) * (1.0 - adapter.lambda_init)  # per-head RMSNorm × (1 − λ_init)
        if full:
            out, p = od, pd
        else:
            b = beta.to(od.dtype)
            out = (1.0 - b) * o1 + b * od  # β(t) blend from the pretrained output
            p = None if pd is None else (1.0 - beta) * p1 + beta * pd
    if p is None:
        return out, None
    if keep:
        adapter.last_maps = AttentionWeights(*(None if t is None else t.detach() for t in (first, second, p)))
    if not need_weights:
        return out, None
    combined = p.to(q.dtype)
    combined._diffattn_branches = tuple(None if t is None else _SELF if t is p else t.to(q.dtype)
                                        for t in (first, second))  # _SELF: no reference cycle
    return out, combined
