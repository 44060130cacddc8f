"""The attention operator's public module, as ``torch.nn.functional`` is PyTorch's: :func:`diff_attention`,
:func:`diff_attention_pairs`, :func:`attention`, :func:`decode_diff_attention`, the masks and ``backend="auto"``'s
rule (:func:`choose_backend`). They are defined in :mod:`diffattn.ops.functional` (the package :mod:`diffattn.ops`
holds the operator, its backends and kernels); this module re-exports them: ``diffattn.functional.diff_attention``
is ``diffattn.ops.diff_attention``.
"""

from __future__ import annotations

from .ops.functional import (
    BACKENDS,
    DECODE_MAX_QUERIES,
    SCORE_HOOK,
    AttentionWeights,
    BackendChoice,
    PreparedMask,
    attention,
    causal_mask,
    choose_backend,
    compute_dtype,
    decode_diff_attention,
    diff_attention,
    diff_attention_pairs,
    prepare_mask,
    restrict_mask,
    sliding_window_mask,
    takes_triton,
    upcast,
)

__all__ = [
    "diff_attention",
    "diff_attention_pairs",
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
    "compute_dtype",
    "upcast",
    "takes_triton",
    "SCORE_HOOK",
]
