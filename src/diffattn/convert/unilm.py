"""Differential Transformer V2 (Ye et al. 2026, microsoft/unilm ``multihead_flashdiffv2.py``) ↔ diffattn, exactly.

The official module ``MultiheadFlashDiffV2(use_diff_v2=True, d_model=D, num_heads=h, num_kv_heads=h_kv,
head_dim=d)`` and :class:`~diffattn.DiffAttentionV2` ``(D, h, num_kv_heads=h_kv, head_dim=d, qkv_bias=False,
out_bias=False, causal=True, rope=...)`` compute the same function (docs/design.md §3.4):

    Q = x W_q (2h heads of width d), K = x W_k, V = x W_v (h_kv heads of width d), RoPE on Q and K
    O_i = A_{2i} V − σ(x W_λ)_i ⊙ A_{2i+1} V,    out = concat_i O_i W_oᵀ     (causal, no biases, no sub-norm)

**Keys.** ``q_proj``, ``k_proj``, ``v_proj`` keep their names; ``o_proj`` ↔ ``out_proj``; ``lambda_proj`` ↔
``lambda_fn.lambda_proj``. The head order is the same on both sides (query heads 2i and 2i+1 are the two branches
of head i), so no head is permuted.

**RoPE.** The official module rotates Q and K with flash-attn's ``apply_rotary_emb(..., interleaved=True)``
(GPT-J): channels (2m, 2m+1) of a head form pair m. diffattn's ``rope="half"`` (GPT-NeoX, Llama) pairs channels
(m, m + d/2). Both give pair m the frequency θ_m = base^(−2m/d). Converting between them permutes the d rows of
every Q and K head with

    half channel c  =  interleaved channel p[c],   p = [0, 2, 4, …, d − 2, 1, 3, 5, …, d − 1]

(:func:`interleaved_to_half_perm`; its inverse :func:`half_to_interleaved_perm`). Pair m lands on pair m, so
rotating then permuting equals permuting then rotating; and one permutation applied to every Q and K head leaves
each q·k unchanged. V, ``o_proj`` and ``lambda_proj`` are not touched. With ``rope="interleaved"`` (the default)
the tensors are copied unchanged.

The official module takes its RoPE tables from the caller (``rel_pos = (cos, sin)``, each (N, d/2));
:func:`unilm_rel_pos` builds them with the base diffattn uses, so both sides rotate by the same angles.

Functions: :func:`unilm_v2_to_diffattn_state_dict` and :func:`diffattn_to_unilm_v2_state_dict` convert whole state
dicts (every V2 attention found by its λ projection, under any prefix; other keys are passed through unchanged);
:func:`from_unilm_v2` builds a :class:`~diffattn.DiffAttentionV2` from an official module or its state dict;
:func:`to_unilm_v2_state_dict` gives the official constructor's arguments and state dict of a layer. Converters keep
the source's dtype and device and raise ``ValueError`` for anything the other side cannot express.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn as nn

from ..layers import DiffAttentionV2
from ..layers.rope import ROPE_STYLES
from ._common import StateDict, check_no_extra, take

__all__ = [
    "interleaved_to_half_perm",
    "half_to_interleaved_perm",
    "permute_head_channels",
    "unilm_v2_to_diffattn_state_dict",
    "diffattn_to_unilm_v2_state_dict",
    "from_unilm_v2",
    "to_unilm_v2_state_dict",
    "unilm_rel_pos",
]

_WHERE = "unilm Diff Transformer V2"
_UNILM_LAMBDA, _OURS_LAMBDA = "lambda_proj.weight", "lambda_fn.lambda_proj.weight"


# ------------------------------------------------------------------------------------------ permutations


def _check_head_dim(head_dim) -> None:
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even integer >= 2 (RoPE rotates channel pairs), got {head_dim!r}")


def interleaved_to_half_perm(head_dim: int) -> torch.Tensor:
    """Index ``p`` with ``half[c] = interleaved[p[c]]`` within one head: p = [0, 2, …, d − 2, 1, 3, …, d − 1]."""
    _check_head_dim(head_dim)
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def half_to_interleaved_perm(head_dim: int) -> torch.Tensor:
    """Inverse of :func:`interleaved_to_half_perm`: ``interleaved[c] = half[p[c]]``, p = [0, d/2, 1, d/2 + 1, …]."""
    _check_head_dim(head_dim)
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()


def permute_head_channels(t: torch.Tensor, perm: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Reorder the rows of every head of a weight (n·d, D): out row c of head j = in row perm[c] of head j."""
    if t.dim() != 2 or t.shape[0] % head_dim:
        raise ValueError(f"tensor of shape {tuple(t.shape)} does not hold heads of width head_dim={head_dim} "
                         f"along dim 0")
    n = t.shape[0] // head_dim
    return t.reshape(n, head_dim, t.shape[1])[:, perm.to(t.device)].reshape(t.shape).clone()


def _rope_perm(source: str, target: str, head_dim: int) -> torch.Tensor | None:
    for name, style in (("rope", target), ("unilm_rope", source)):
        if style not in ROPE_STYLES:
            raise ValueError(f"{name} must be one of {ROPE_STYLES}, got {style!r}")
    if source == target:
        return None
    return interleaved_to_half_perm(head_dim) if source == "interleaved" else half_to_interleaved_perm(head_dim)


# ------------------------------------------------------------------------------------------ state dicts


def _sizes(q: torch.Tensor, k: torch.Tensor, lam: torch.Tensor, where: str) -> tuple[int, int, int]:
    """(num_heads h, num_kv_heads h_kv, head_dim d) from q_proj (2h·d, D), k_proj (h_kv·d, D), lambda_proj (h, D)."""
    h = lam.shape[0]
    if q.shape[0] % (2 * h):
        raise ValueError(f"{where}: q_proj has {q.shape[0]} rows, not 2·num_heads·head_dim with num_heads={h} "
                         f"(the rows of lambda_proj)")
    d = q.shape[0] // (2 * h)
    if k.shape[0] % d:
        raise ValueError(f"{where}: k_proj has {k.shape[0]} rows, not a multiple of head_dim={d}")
    if not q.shape[1] == k.shape[1] == lam.shape[1]:
        raise ValueError(f"{where}: q_proj, k_proj and lambda_proj must read the same width, got "
                         f"{q.shape[1]}, {k.shape[1]}, {lam.shape[1]}")
    return h, k.shape[0] // d, d


def _prefixes(sd: StateDict, lam_key: str, where: str) -> list[str]:
    found = sorted(k[: -len(lam_key)] for k in sd if k == lam_key or k.endswith("." + lam_key))
    if not found:
        raise ValueError(f"{where} state dict has no {lam_key!r} (under any prefix): it holds no Diff Transformer V2 "
                         f"attention")
    return found


def _replace_attention(out: dict[str, torch.Tensor], p: str, old: Iterable[str], tensors: Sequence[torch.Tensor],
                       perm: torch.Tensor | None, head_dim: int, new: Sequence[str]) -> None:
    """Replace the keys ``p + old`` of ``out`` by ``p + new``, holding copies of ``tensors`` (q, k, v, the output
    projection, λ): the q and k rows permuted per head with ``perm`` (None: as they are)."""
    for name in old:
        del out[p + name]
    q, k, *rest = tensors
    qk = [t.clone() if perm is None else permute_head_channels(t, perm, head_dim) for t in (q, k)]
    for name, t in zip(new, (*qk, *(t.clone() for t in rest)), strict=True):
        out[p + name] = t


def unilm_v2_to_diffattn_state_dict(sd: StateDict, *, rope: str = "interleaved",
                                    unilm_rope: str = "interleaved") -> dict[str, torch.Tensor]:
    """An official ``MultiheadFlashDiffV2`` state dict → a :class:`~diffattn.DiffAttentionV2` one.

    Every attention is found by its ``<prefix>lambda_proj.weight``; its ``o_proj`` becomes ``out_proj`` and its
    ``lambda_proj`` ``lambda_fn.lambda_proj``. Q and K rows are permuted per head with
    :func:`interleaved_to_half_perm` when ``rope`` (the diffattn layer's style) differs from ``unilm_rope`` (the
    checkpoint's, interleaved for the official module). Keys of other modules are passed through unchanged; keys
    of an attention the target cannot hold (biases) raise. The target layer: ``DiffAttentionV2(D, h,
    num_kv_heads=h_kv, head_dim=d, qkv_bias=False, out_bias=False, causal=True, rope=rope)``.
    """
    out = {k: v for k, v in sd.items()}
    for p in _prefixes(sd, _UNILM_LAMBDA, _WHERE):
        where = f"{_WHERE} attention {p or '(top level)'}"
        names = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", _UNILM_LAMBDA}
        own = {k[len(p):]: v for k, v in sd.items()
               if k.startswith(p) and k[len(p):].split(".")[0] in {n.split(".")[0] for n in names}}
        check_no_extra(own, names, where)  # biases: the official module has none and the target takes none
        q, k, v, o, lam = (take(sd, p + n, where, ndim=2) for n in ("q_proj.weight", "k_proj.weight", "v_proj.weight",
                                                                    "o_proj.weight", _UNILM_LAMBDA))
        h, _, d = _sizes(q, k, lam, where)
        if v.shape != k.shape or o.shape != (q.shape[1], h * d):
            raise ValueError(f"{where}: v_proj must have k_proj's shape {tuple(k.shape)} and o_proj shape "
                             f"{(q.shape[1], h * d)}, got {tuple(v.shape)} and {tuple(o.shape)}")
        _replace_attention(out, p, names, (q, k, v, o, lam), _rope_perm(unilm_rope, rope, d), d,
                           ("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", _OURS_LAMBDA))
    return out


def _zero_or_raise(sd: StateDict, key: str, where: str) -> None:
    t = sd[key]
    if torch.count_nonzero(t).item():
        raise ValueError(f"{where}: {key} is not zero and the official module has no biases")


def diffattn_to_unilm_v2_state_dict(sd: StateDict, *, rope: str = "interleaved",
                                    unilm_rope: str = "interleaved") -> dict[str, torch.Tensor]:
    """A :class:`~diffattn.DiffAttentionV2` state dict → an official ``MultiheadFlashDiffV2`` one (the inverse of
    :func:`unilm_v2_to_diffattn_state_dict`).

    Every attention is found by its ``<prefix>lambda_fn.lambda_proj.weight``. Biases that are all zero are dropped
    (they change nothing); any other bias, a λ bias and a sub-norm weight raise: the official module has none.
    ``rope`` is the diffattn layer's style, ``unilm_rope`` the style the checkpoint is written in.
    """
    out = {k: v for k, v in sd.items()}
    for p in _prefixes(sd, _OURS_LAMBDA, "DiffAttentionV2"):
        where = f"DiffAttentionV2 {p or '(top level)'}"
        own = {k[len(p):] for k in sd if k.startswith(p)}
        if "lambda_fn.lambda_proj.bias" in own:
            raise ValueError(f"{where}: lambda_proj has a bias and the official lambda_proj has none")
        if any(k.startswith("diff_norm.") for k in own):
            raise ValueError(f"{where}: the layer has a sub-norm (sub_norm=True) and the official module has none")
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            if f"{name}.bias" in own:
                _zero_or_raise(sd, p + f"{name}.bias", where)
                del out[p + f"{name}.bias"]
        ours = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", _OURS_LAMBDA)
        q, k, v, o, lam = (take(sd, p + n, where, ndim=2) for n in ours)
        h, _, d = _sizes(q, k, lam, where)
        _replace_attention(out, p, ours, (q, k, v, o, lam), _rope_perm(rope, unilm_rope, d), d,
                           ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", _UNILM_LAMBDA))
    return out


# ------------------------------------------------------------------------------------------ modules


def from_unilm_v2(source: nn.Module | StateDict, *, rope: str = "interleaved", rope_theta: float = 10000.0,
                  unilm_rope: str = "interleaved", backend: str = "auto") -> DiffAttentionV2:
    """An official ``MultiheadFlashDiffV2`` (``use_diff_v2=True``) or its state dict → an equivalent causal
    :class:`~diffattn.DiffAttentionV2`.

    Sizes come from the module's attributes or the tensors' shapes (D, h, h_kv, d: ``head_dim`` may differ from
    D/h). ``rope_theta`` is the base of the caller's RoPE tables (:func:`unilm_rel_pos`); ``rope`` the new layer's
    style (the module docstring has the permutation for ``"half"``). Parameters keep their dtype and device.
    h must be divisible by h_kv (so each pair of query heads reads one K/V head), which the official module's
    flash-attn call does not require.
    """
    if isinstance(source, nn.Module):
        if not getattr(source, "use_diff_v2", False) or getattr(source, "lambda_proj", None) is None:
            raise ValueError(f"source must be a MultiheadFlashDiffV2 with use_diff_v2=True (it has lambda_proj), got "
                             f"{type(source).__name__}")
        sd = source.state_dict()
    else:
        sd = source
    extra = sorted(k for k in sd if k not in {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                              _UNILM_LAMBDA})
    if extra:
        raise ValueError(f"{_WHERE} attention state dict has keys this converter cannot express exactly: {extra}")
    q, k, lam = (take(sd, n, _WHERE, ndim=2) for n in ("q_proj.weight", "k_proj.weight", _UNILM_LAMBDA))
    h, h_kv, d = _sizes(q, k, lam, _WHERE)
    if isinstance(source, nn.Module):
        got = (source.d_model, source.num_heads, source.num_kv_heads, source.head_dim)
        if got != (q.shape[1], h, h_kv, d):
            raise ValueError(f"module attributes (d_model, num_heads, num_kv_heads, head_dim) = {got} do not match "
                             f"its weights {(q.shape[1], h, h_kv, d)}")
    if h % h_kv:
        raise ValueError(f"num_heads={h} must be divisible by num_kv_heads={h_kv}: query heads 2i and 2i+1 must read "
                         f"the same K/V head for DiffAttentionV2")
    with torch.device("meta"):
        ours = DiffAttentionV2(q.shape[1], h, num_kv_heads=h_kv, head_dim=d, qkv_bias=False, out_bias=False,
                               causal=True, rope=rope, rope_theta=rope_theta, backend=backend)
    ours.load_state_dict(unilm_v2_to_diffattn_state_dict(sd, rope=rope, unilm_rope=unilm_rope), strict=True,
                         assign=True)
    return ours.train(source.training) if isinstance(source, nn.Module) else ours


def to_unilm_v2_state_dict(module: DiffAttentionV2, *,
                           unilm_rope: str = "interleaved") -> tuple[dict, dict[str, torch.Tensor]]:
    """(constructor arguments, state dict) of an official ``MultiheadFlashDiffV2`` equal to ``module``:
    ``MultiheadFlashDiffV2(**args).load_state_dict(sd)`` (strict) computes the same function when called with
    ``rel_pos = unilm_rel_pos(N, d, module.rotary.base)``.

    ``module`` must be what the official module can express: λ form ``token_sigmoid`` without bias, no sub-norm,
    causal, a rotary embedding, no softcap, sliding window or attention dropout; zero biases are dropped.
    """
    if not isinstance(module, DiffAttentionV2):
        raise ValueError(f"module must be a diffattn.DiffAttentionV2, got {type(module).__name__}")
    problems = []
    if module.lambda_form != "token_sigmoid":
        problems.append(f"lambda_form={module.lambda_form!r} (the official λ is token_sigmoid)")
    if not isinstance(module.diff_norm, nn.Identity):
        problems.append("sub_norm=True (the official module has no sub-norm)")
    if module.out_scale != 1.0:
        problems.append(f"output_scale={module.config.output_scale!r} (the official module scales by 1)")
    if not module.causal:
        problems.append("causal=False (the official module is causal)")
    if module.rotary is None:
        problems.append("rope=None (the official module always applies RoPE)")
    if module.softcap is not None or module.sliding_window is not None or module.attn_drop:
        problems.append("softcap, sliding_window or attn_drop set (the official module has none)")
    if problems:
        raise ValueError("module cannot be written as the official Diff Transformer V2 module: " + "; ".join(problems))
    sd = {k: v.detach() for k, v in module.state_dict().items()}
    sd = diffattn_to_unilm_v2_state_dict(sd, rope=module.rotary.style, unilm_rope=unilm_rope)
    args = dict(use_diff_v2=True, d_model=module.dim, num_heads=module.num_heads, num_kv_heads=module.num_kv_heads,
                head_dim=module.head_dim)
    return args, sd


def unilm_rel_pos(seq_len: int, head_dim: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The official module's ``rel_pos = (cos, sin)``, each (seq_len, head_dim/2): angle p·θ_m at position p and
    pair m, θ_m = base^(−2m/d), computed in float64 (the angles diffattn's
    :class:`~diffattn.layers.rope.RotaryEmbedding` uses)."""
    _check_head_dim(head_dim)
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    if not (isinstance(base, (int, float)) and math.isfinite(base) and base > 1):
        raise ValueError(f"base must be a finite float > 1, got {base!r}")
    inv_freq = float(base) ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.arange(seq_len, dtype=torch.float64, device=device)[:, None] * inv_freq  # (N, d/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)
