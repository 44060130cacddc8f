"""The math of every retrofit (DESIGN.md §3.4): one adapter module per retrofitted attention layer.

Per standard head of width d (h query heads, model width D), with the pretrained W_q, W_k, W_v, W_o kept:

| method        | second branch                          | output                                    | new params |
|---------------|----------------------------------------|-------------------------------------------|------------|
| ``daa``       | A2 = A(Q W_daa, K), W_daa (h, d, d)     | (A1 − λ(t) A2) V                          | D²/h (+1)  |
| ``dex``       | none                                   | (A1 V)(I − λ(t) W_dex), W_dex (h, d, d)   | D²/h (+1)  |
| ``diffq``     | Q2 = (X W_dq) W_q, W_dq (D, D)          | (A(Q1, K) − λ(t) A(Q2, K)) V              | D² (+1)    |
| ``diffk``     | K2 = (X W_dk) W_k, W_dk (D, D)          | (A(Q, K1) − λ(t) A(Q, K2)) V              | D² (+1)    |
| ``diffv``     | V2 = (X W_dv) W_v, W_dv (D, D)          | A (V1 − λ(t) V2)                          | D² (+1)    |
| ``shared_qk`` | A2 = A1                                | (1 − λ_init)·RMSNorm((A1 − λ A1) V)        | 4d + d     |
| ``split_heads`` | Q/K channels of a head in 2 groups  | (1 − λ_init)·RMSNorm((A1 − λ A2) V)       | 2d + d     |

Seed 001 (DAA, DEX, DiffQ/K/V): eq. 3 for λ(t), eq. 4 for DAA, eq. 11 for DEX, App. B for the parameter counts,
App. D for the pseudocode (every new matrix is the identity at init). λ(t) is
:class:`diffattn.lambdas.AnnealedLambda`: λ(0) = 0, so at step 0 the layer computes the pretrained function exactly,
and the (t/T)·λ_init ramp moves it off that point even while every new matrix is still the identity.

Seed 002 (§3.2 "original" = ``split_heads``, §3.3 "proposed" = ``shared_qk``): λ is re-parameterised (Ye et al.
eq. 2, :class:`~diffattn.lambdas.ReparamLambda`), each head output goes through an RMSNorm of the head width and is
scaled by (1 − λ_init). These layers do **not** compute the pretrained function (the RMSNorm alone changes it), so
to keep the library's promise that a retrofit starts from the pretrained model, their output is blended in over the
annealing window: O = (1 − β) O_pretrained + β O_seed002, β(t) = min(1, t/T). From t = T on the layer is exactly
seed 002's. This blend is our addition, not the paper's.

shared-QK is degenerate, faithfully so: (A1 − λ A1) V = (1 − λ) A1 V, and the RMSNorm that follows removes every
dependence on λ except its sign (the public code of seed 002 has the same property). We implement it as published.

split-heads splits the d channels of each pretrained Q/K head into two groups of d/2 that keep rotary pairs
(channel i and i + d/2 under ``rotate_half`` RoPE) together: G1 = [0, d/4) ∪ [d/2, 3d/4), G2 = the rest, so each
branch's scores stay functions of relative position. Scale: the model's scale × √2 (the width halves); λ vectors
have the branch width d/2 (Ye et al.); V keeps width d.

DAA applies W_daa to the query **before** rotary embedding (when the model has one), so A2 stays a function of
relative positions; at init both orders agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..lambdas import AnnealedLambda, ReparamLambda, resolve_lambda_init
from ..layers.norm import head_rms_norm

__all__ = [
    "METHODS",
    "SEED001_METHODS",
    "SEED002_METHODS",
    "RetrofitAdapter",
    "eager_branch",
    "sdpa_branch",
    "run_method",
    "split_channels",
]

SEED001_METHODS = ("daa", "dex", "diffq", "diffk", "diffv")
SEED002_METHODS = ("shared_qk", "split_heads")
METHODS = SEED001_METHODS + SEED002_METHODS

#: which projection input a method transforms: X' = X W_d{q,k,v} (seed 001 App. D.2)
INPUT_METHODS = {"diffq": "q", "diffk": "k", "diffv": "v"}


class RetrofitAdapter(nn.Module):
    """The new weights of one retrofitted attention layer and the λ that weighs them.

    A plain ``nn.Module`` (peft's ``modules_to_save`` can wrap it). Attributes, by method:
    ``W_daa`` / ``W_dex`` (h, d, d); ``W_dq`` / ``W_dk`` / ``W_dv`` (D, D), all identity at init;
    ``lam``: :class:`AnnealedLambda` (seed 001, holds ``lambda_learn`` and the ``step`` buffer) or
    :class:`ReparamLambda` (seed 002); seed 002 also has ``diff_norm`` (RMSNorm of width d) and its own ``step``.

    Args:
        method: one of :data:`METHODS`.
        dim: D, the width of the layer input.
        num_heads: h, the query head count of the pretrained layer.
        head_dim: d, the pretrained head width.
        lambda_init: λ_init, a float or ``"ye"`` (0.8 − 0.6·exp(−0.3·l) with ``layer_index`` l, 0-based).
        anneal_steps: T of seed 001 eq. 3 (and of the seed 002 blend).
        layer_index: 0-based index of this layer among the retrofitted model's attention layers.
    """

    def __init__(self, method: str, *, dim: int, num_heads: int, head_dim: int, lambda_init: float | str = 0.8,
                 anneal_steps: int = 1000, layer_index: int = 0, device=None, dtype=None):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if not isinstance(anneal_steps, int) or anneal_steps <= 0:
            raise ValueError(f"anneal_steps must be a positive int, got {anneal_steps!r}")
        if method == "split_heads" and head_dim % 4 != 0:
            raise ValueError(f"method 'split_heads' needs a head width divisible by 4 (to split rotary pairs "
                             f"evenly), got head_dim={head_dim}")
        self.method = method
        self.dim, self.num_heads, self.head_dim = int(dim), int(num_heads), int(head_dim)
        self.layer_index = int(layer_index)
        self.lambda_init = resolve_lambda_init(lambda_init, layer_index)
        self.anneal_steps = int(anneal_steps)
        f = {"device": device, "dtype": dtype}
        h, d, D = self.num_heads, self.head_dim, self.dim
        if method == "daa":
            self.W_daa = nn.Parameter(torch.eye(d, **f).repeat(h, 1, 1))  # (h, d, d)
        elif method == "dex":
            self.W_dex = nn.Parameter(torch.eye(d, **f).repeat(h, 1, 1))  # (h, d, d)
        elif method in INPUT_METHODS:
            setattr(self, f"W_d{INPUT_METHODS[method]}", nn.Parameter(torch.eye(D, **f)))  # (D, D)
        if method in SEED001_METHODS:
            self.lam = AnnealedLambda(self.lambda_init, self.anneal_steps)
            if device is not None:
                self.lam.to(device)
        else:
            width = d if method == "shared_qk" else d // 2
            self.lam = ReparamLambda(width, self.lambda_init)
            self.diff_norm = head_rms_norm(d)
            self.register_buffer("step", torch.zeros((), dtype=torch.long))
            if device is not None:
                self.lam.to(device)
                self.diff_norm.to(device)
                self.step = self.step.to(device)
            if dtype is not None:
                self.diff_norm.to(dtype)

    # ------------------------------------------------------------------------------------------ schedule

    @property
    def step_buffer(self) -> torch.Tensor:
        """The step counter t (a 0-d long buffer in the state dict)."""
        return self.lam.step if self.method in SEED001_METHODS else self.step

    @torch.no_grad()
    def advance(self, n: int = 1) -> None:
        """t ← t + n; call once per optimizer step (:func:`diffattn.adapters.step` does it for a model)."""
        self.step_buffer.add_(n)

    def lambda_value(self) -> torch.Tensor:
        """λ(t) (seed 001 eq. 3) or the re-parameterised λ (seed 002 eq. 3): a 0-d float32 tensor."""
        return self.lam.value().reshape(())

    def blend(self) -> torch.Tensor:
        """β(t) = min(1, t/T) for seed 002 methods (weight of the seed 002 output); 1 is "fully differential"."""
        return torch.clamp(self.step_buffer.float() / self.anneal_steps, max=1.0)

    # --------------------------------------------------------------------------------------- transforms

    def transform_input(self, x: torch.Tensor) -> torch.Tensor:
        """X' = X W_d for DiffQ / DiffK / DiffV (seed 001 App. D.2). x: (B, N, D)."""
        w = getattr(self, f"W_d{INPUT_METHODS[self.method]}")
        return torch.matmul(x, w.to(x.dtype))  # (B, N, D)

    def transform_query(self, q: torch.Tensor) -> torch.Tensor:
        """Q W_daa per head (seed 001 eq. 4). q: (B, h, N, d) → (B, h, N, d)."""
        return torch.einsum("bhnd,hde->bhne", q, self.W_daa.to(q.dtype))

    def extra_repr(self) -> str:
        return (f"method={self.method!r}, dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"lambda_init={self.lambda_init:.4g}, anneal_steps={self.anneal_steps}")


# ------------------------------------------------------------------------------------ attention branches


def _repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, N, w) → (B, Hkv·groups, N, w): key/value head j serves query heads j·groups … (j+1)·groups − 1."""
    if groups == 1:
        return t
    B, H, N, w = t.shape
    return t[:, :, None].expand(B, H, groups, N, w).reshape(B, H * groups, N, w)


def _end_aligned_causal(nq: int, nk: int, device) -> torch.Tensor:
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + (nk - nq)  # (Nq, Nk) bool, True = attend


def _window(nq: int, nk: int, window: int, device) -> torch.Tensor:
    """End-aligned causal sliding-window bool mask: query i sees keys in (i + Nk − Nq − window, i + Nk − Nq]."""
    i = torch.arange(nq, device=device)[:, None] + (nk - nq)
    j = torch.arange(nk, device=device)[None, :]
    return (j <= i) & (j > i - window)


def eager_branch(q, k, v, mask, *, scale: float, dropout: float = 0.0, training: bool = False,
                 softcap: float | None = None, is_causal: bool = False, sliding_window: int | None = None):
    """softmax(softcap(Q Kᵀ s) + M) V with the map, mirroring transformers' ``eager_attention_forward``.

    q: (B, H, Nq, d); k: (B, Hkv, Nk, d); v: (B, Hkv, Nk, dv); mask: None, bool (True = attend, filled with
    finfo.min) or additive float (B|1, 1|H, Nq, ≥Nk). The causal (and sliding-window) mask is added only when
    ``mask`` is None. Softcap (Gemma 2) is tanh(S/c)·c on the logits, before the mask. Returns (B, H, Nq, dv) and
    the (B, H, Nq, Nk) map in q's dtype.
    """
    groups = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    nq, nk = q.shape[2], k.shape[2]
    s = torch.matmul(q, k.transpose(2, 3)) * scale  # (B, H, Nq, Nk)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if mask is None and (is_causal or sliding_window) and nq > 1:
        mask = _window(nq, nk, sliding_window, q.device) if sliding_window else _end_aligned_causal(nq, nk, q.device)
    if mask is not None:
        mask = mask[..., :nk]
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min) if mask.dtype == torch.bool else s + mask
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    pd = F.dropout(p, p=dropout, training=training) if dropout > 0.0 else p
    return torch.matmul(pd, v), p  # (B, H, Nq, dv), (B, H, Nq, Nk)


def sdpa_branch(q, k, v, mask, *, scale: float, dropout: float = 0.0, training: bool = False,
                softcap: float | None = None, is_causal: bool = False, sliding_window: int | None = None):
    """Ordinary attention through ``F.scaled_dot_product_attention`` (O(N) memory), mirroring transformers'
    ``sdpa_attention_forward``: the causal flag is used only when no mask is given and Nq > 1; with Nk > Nq it
    becomes an end-aligned bool mask. Softcap cannot run here (it acts before the softmax): it goes to
    :func:`eager_branch`. Returns (B, H, Nq, dv) and None.
    """
    if softcap is not None:
        return eager_branch(q, k, v, mask, scale=scale, dropout=dropout, training=training, softcap=softcap,
                            is_causal=is_causal, sliding_window=sliding_window)
    groups = q.shape[1] // k.shape[1]
    nq, nk = q.shape[2], k.shape[2]
    causal = False
    if mask is None and nq > 1:
        if sliding_window and nk > sliding_window:
            mask = _window(nq, nk, sliding_window, q.device)
        elif is_causal and nk == nq:
            causal = True
        elif is_causal:
            mask = _end_aligned_causal(nq, nk, q.device)
    if mask is not None:
        mask = mask[..., :nk]
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout if training else 0.0,
                                       is_causal=causal, scale=scale)
    return o, None


Branch = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def split_channels(head_dim: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel indices of the two split-head groups: G1 = [0, d/4) ∪ [d/2, 3d/4), G2 = the rest (rotary pairs
    i, i + d/2 stay in one group)."""
    d, q4 = head_dim, head_dim // 4
    g1 = torch.cat([torch.arange(0, q4), torch.arange(2 * q4, 3 * q4)]).to(device)
    g2 = torch.cat([torch.arange(q4, 2 * q4), torch.arange(3 * q4, d)]).to(device)
    return g1, g2


def run_method(adapter: RetrofitAdapter, branch: Branch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
               q2: torch.Tensor | None = None, k2: torch.Tensor | None = None, v2: torch.Tensor | None = None,
               scale: float, need_weights: bool = False, **branch_kwargs) -> tuple[torch.Tensor,
                                                                                   torch.Tensor | None]:
    """The attention core of a retrofitted layer, after projection, rotary embedding and cache.

    q, q2: (B, h, Nq, d); k, k2: (B, Hkv, Nk, d); v, v2: (B, Hkv, Nk, d). ``q2`` (DAA, DiffQ), ``k2`` (DiffK),
    ``v2`` (DiffV) are the second-branch tensors. ``branch`` is :func:`eager_branch` or :func:`sdpa_branch`.
    Returns the (B, h, Nq, d) output before the output projection and, with ``need_weights`` (and a branch that
    returns maps), the combined map: A1 − λ A2 (DAA, DiffQ, DiffK), A (DiffV, DEX), (1 − λ) A1 (shared-QK), or
    A1 − λ A2 on the halves (split-heads); for seed 002 methods blended as the output is.
    """
    m = adapter.method
    kw = dict(branch_kwargs, scale=scale)
    if m in ("daa", "diffq", "diffk", "diffv"):
        lam = adapter.lambda_value()
        o1, p1 = branch(q, k, v, **kw)
        o2, p2 = branch(q if q2 is None else q2, k if k2 is None else k2, v if v2 is None else v2, **kw)
        out = o1 - lam.to(o1.dtype) * o2  # seed 001 eq. 4 / App. D: (A1 − λ A2) V, or A (V1 − λ V2)
        if p1 is None or not need_weights:
            return out, None
        return out, (p1 if m == "diffv" else p1 - lam.to(p1.dtype) * p2)
    if m == "dex":
        lam = adapter.lambda_value()
        o1, p1 = branch(q, k, v, **kw)
        o_w = torch.einsum("bhnd,hde->bhne", o1, adapter.W_dex.to(o1.dtype))  # (B, h, Nq, d)
        return o1 - lam.to(o1.dtype) * o_w, p1  # seed 001 eq. 11: (A1 V)(I − λ W_dex)
    beta = adapter.blend()
    full = bool(beta >= 1.0)
    lam = adapter.lambda_value()
    if m == "shared_qk":
        o1, p1 = branch(q, k, v, **kw)
        od = (1.0 - lam).to(o1.dtype) * o1  # (A1 − λ A1) V, seed 002 §3.3
        pd = None if p1 is None else (1.0 - lam).to(p1.dtype) * p1
    else:
        g1, g2 = split_channels(q.shape[-1], q.device)
        kw2 = dict(kw, scale=scale * math.sqrt(2.0))
        oa, pa = branch(q[..., g1], k[..., g1], v, **kw2)
        ob, pb = branch(q[..., g2], k[..., g2], v, **kw2)
        od = oa - lam.to(oa.dtype) * ob  # Ye et al. eq. 1 on the two channel groups (seed 002 §3.2)
        pd = None if pa is None else pa - lam.to(pa.dtype) * pb
        o1, p1 = (None, None) if full else branch(q, k, v, **kw)
    od = adapter.diff_norm(od) * (1.0 - adapter.lambda_init)  # per-head RMSNorm × (1 − λ_init), seed 002 eq. 6
    if full:
        return od, (pd if need_weights else None)
    b = beta.to(od.dtype)
    out = (1.0 - b) * o1 + b * od
    p = None if (pd is None or not need_weights) else (1.0 - b) * p1 + b * pd
    return out, p
