"""The module that holds a retrofitted layer's new weights, and the two calls the bindings make: the second branch
(:func:`second_branch`) and the attention core (:func:`run_method`). Both dispatch through the method registry
(:mod:`diffattn.adapters.methods.base`); nothing here names a method."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ...lambdas import DEFAULT_LAMBDA_INIT, resolve_lambda_init
from ...ops import AttentionWeights
from .base import Project, build_method
from .ops import MASKED_ROWS

__all__ = ["MAX_STEP", "RetrofitAdapter", "second_branch", "run_method", "branch_maps"]

#: the largest schedule step t a layer can hold (its ``step`` buffer is an int64)
MAX_STEP = 2**63 - 1


class RetrofitAdapter(nn.Module):
    """The new weights of one retrofitted attention layer and the λ that weighs them.

    A plain ``nn.Module`` (peft's ``modules_to_save`` can wrap it). What it holds is the method's
    (:class:`~diffattn.adapters.methods.RetrofitMethod`, ``method_impl``): ``W_daa`` / ``W_dex`` (h, d, d);
    ``W_dq`` / ``W_dk`` / ``W_dv`` (D, D), all identity at init; ``lam``: :class:`~diffattn.lambdas.AnnealedLambda`
    (DAA (2025) methods, holds ``lambda_learn`` and the ``step`` buffer) or :class:`~diffattn.lambdas.ReparamLambda`
    (Li et al. 2025 methods, which also have ``diff_norm``, an RMSNorm of width d, and their own ``step``).

    Args:
        method: a registered method name (:func:`~diffattn.adapters.methods.list_methods`).
        dim: D, the width of the layer input.
        num_heads: h, the query head count of the pretrained layer.
        head_dim: d, the pretrained head width.
        lambda_init: λ_init, a finite float or ``"ye"`` (0.8 − 0.6·exp(−0.3·l) with ``layer_index`` l, 0-based).
        anneal_steps: T of DAA (2025) eq. 3 (and of the blend).
        layer_index: 0-based index of this layer among the retrofitted model's attention layers.
        value_dim: the width of a value head when it differs from the query/key head width ``head_dim``
            (Ultralytics' ``Attention``); ``W_dex`` and ``diff_norm`` act on it. Default ``head_dim``.
    """

    def __init__(self, method: str, *, dim: int, num_heads: int, head_dim: int,
                 lambda_init: float | str = DEFAULT_LAMBDA_INIT, anneal_steps: int = 1000, layer_index: int = 0,
                 value_dim: int | None = None, device=None, dtype=None):
        super().__init__()
        impl = build_method(method)
        if isinstance(anneal_steps, bool) or not isinstance(anneal_steps, int) or anneal_steps <= 0:
            raise ValueError(f"anneal_steps must be a positive int, got {anneal_steps!r}")
        self.method = method
        self.method_impl = impl
        self.dim, self.num_heads, self.head_dim = int(dim), int(num_heads), int(head_dim)
        self.value_dim = self.head_dim if value_dim is None else int(value_dim)
        impl.check(dim=self.dim, num_heads=self.num_heads, head_dim=self.head_dim, value_dim=self.value_dim)
        self.layer_index = int(layer_index)
        self.lambda_init = resolve_lambda_init(lambda_init, layer_index)
        if not math.isfinite(self.lambda_init):
            raise ValueError(f"lambda_init must be finite, got {self.lambda_init!r}")
        self.anneal_steps = int(anneal_steps)
        #: set by ``capture_attention``: keep the maps of every forward call in ``last_maps``
        self.keep_maps = False
        self.last_maps: AttentionWeights | None = None
        impl.init_parameters(self, device=device, dtype=dtype)
        impl.init_schedule(self, device=device, dtype=dtype)

    # ------------------------------------------------------------------------------------------ schedule

    @property
    def step_buffer(self) -> torch.Tensor:
        """The step counter t (a 0-d long buffer in the state dict)."""
        return self.method_impl.step_buffer(self)

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
        """β(t) = min(1, t/T), the weight of the output of a blended method (Li et al. 2025); 1 is "fully
        differential"."""
        dtype = next(self.lam.parameters()).dtype  # λ's dtype: float32, or float64 for a float64 model
        return torch.clamp(self.step_buffer.to(dtype) / self.anneal_steps, max=1.0)

    # --------------------------------------------------------------------------------------- transforms

    def transform_input(self, x: torch.Tensor) -> torch.Tensor:
        """X' = X W_d for DiffQ / DiffK / DiffV (DAA (2025) App. D.2). x: (B, N, D)."""
        if not hasattr(self.method_impl, "transform_input"):
            raise ValueError(f"method {self.method!r} does not transform the layer input (DiffQ, DiffK, DiffV do)")
        return self.method_impl.transform_input(self, x)  # (B, N, D)

    def transform_query(self, q: torch.Tensor) -> torch.Tensor:
        """Q W_daa per head (DAA (2025) eq. 4). q: (B, h, N, d) → (B, h, N, d)."""
        if not hasattr(self.method_impl, "transform_query"):
            raise ValueError(f"method {self.method!r} does not transform the query (DAA does)")
        return self.method_impl.transform_query(self, q)

    def extra_repr(self) -> str:
        return (f"method={self.method!r}, dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"lambda_init={self.lambda_init:.4g}, anneal_steps={self.anneal_steps}")


def second_branch(adapter: RetrofitAdapter, x: torch.Tensor, q: torch.Tensor,
                  project: Project) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The second-branch tensors (q2, k2, v2) of a retrofitted layer, None where the branch reuses the first.

    ``x`` (B, N, D) is the layer input and ``q`` (B, h, N, d) the first-branch query (before any rotary embedding);
    ``project(x', which)`` runs the pretrained projection ``which`` ("q", "k" or "v") on x' and returns its heads
    (B, heads, N, d), with whatever per-head step the family applies to that projection (timm's q/k norm).
    DiffQ / DiffK / DiffV project X W_d (DAA (2025) App. D.2); DAA rotates the query, Q W_daa (eq. 4); the other
    methods have no second projection.
    """
    return adapter.method_impl.second_branch(adapter, x, q, project)


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
    ``adapter.last_maps`` (:class:`~diffattn.functional.AttentionWeights`; what ``capture_attention`` reads): on
    the side, without dropout and without gradients, so the output is the one the layer gives without them, bit
    for bit.
    """
    if masked_rows not in MASKED_ROWS:
        raise ValueError(f"masked_rows must be one of {MASKED_ROWS}, got {masked_rows!r}")
    kw = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale, "dropout_p": dropout_p,
          "softcap": softcap, "backend": backend, "masked_rows": masked_rows}
    keep = bool(getattr(adapter, "keep_maps", False))
    lam = adapter.lambda_value()  # 0-d, float32 (float64 for a float64 model)
    out, first, second, p = adapter.method_impl.attend(adapter, q, k, v, q2=q2, k2=k2, v2=v2, lam=lam,
                                                       weights=need_weights, kw=kw)
    if keep and not need_weights:  # the maps on the side: the output keeps the path it takes without them
        with torch.no_grad():
            _, first, second, p = adapter.method_impl.attend(adapter, q, k, v, q2=q2, k2=k2, v2=v2, lam=lam,
                                                             weights=True, kw=dict(kw, dropout_p=0.0))
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
